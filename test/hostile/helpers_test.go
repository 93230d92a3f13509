package hostile

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}

// tenantNamespace creates a namespace with labels in which the tenant has
// the edit role, and nothing else.
func tenantNamespace(t testing.TB, labels map[string]string) string {
	t.Helper()
	needEnv(t)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tenant-", Labels: labels}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	if err := tenancytest.GrantTenantEdit(ctx, env, ns.Name); err != nil {
		t.Fatal(err)
	}
	// The authorizer sees a new RoleBinding a moment later.
	eventually(t, 10*time.Second, "the tenant's edit rights in "+ns.Name, func() (bool, string) {
		err := asTenant.List(ctx, &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns.Name))
		return err == nil, fmt.Sprint(err)
	})
	return ns.Name
}

// eventually polls cond every 50ms until it holds or timeout passes; cond
// says what it saw, for the failure message.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, seen := cond()
		last = seen
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, last)
	}
}

// inlineLock is a lock on inline Redis endpoints.
func inlineLock(namespace, name string, endpoints ...string) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{"ledger"},
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: endpoints}},
		},
	}
}

// create creates obj as c and fails the test on error.
func create(t testing.TB, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// condition returns a condition of the lock as the operator reports it.
func condition(t testing.TB, nn client.ObjectKey, typ string) (*metav1.Condition, *locksv1alpha1.DistributedLock) {
	t.Helper()
	var dl locksv1alpha1.DistributedLock
	if err := env.Client.Get(context.Background(), nn, &dl); err != nil {
		t.Fatalf("get DistributedLock %s: %v", nn, err)
	}
	return meta.FindStatusCondition(dl.Status.Conditions, typ), &dl
}

// waitCondition waits until the lock's condition has status and reason, and returns it.
func waitCondition(t testing.TB, dl *locksv1alpha1.DistributedLock, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	eventually(t, 30*time.Second, fmt.Sprintf("%s %s=%s (%s)", dl.Name, typ, status, reason), func() (bool, string) {
		c, _ := condition(t, client.ObjectKeyFromObject(dl), typ)
		got = c
		if c == nil {
			return false, "no condition"
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
	return got
}

// events returns the notes of the Events recorded about a named object in namespace.
func events(t testing.TB, namespace, name string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatalf("list Events: %v", err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for an Event with reason about the named object and returns its note.
func waitEvent(t testing.TB, namespace, name, reason string) string {
	t.Helper()
	var note string
	eventually(t, 30*time.Second, fmt.Sprintf("a %s Event on %s", reason, name), func() (bool, string) {
		var seen []string
		for _, e := range events(t, namespace, name) {
			seen = append(seen, e.Reason)
			if e.Reason == reason {
				note = e.Note
				return true, ""
			}
		}
		return false, strings.Join(seen, ",")
	})
	return note
}

// newJob returns a Job that names lock, as a tenant writes it.
func newJob(namespace, name, lock string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
}

// getJob reads a Job as the administrator.
func getJob(t testing.TB, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	var cur batchv1.Job
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &cur); err != nil {
		t.Fatalf("get Job %s: %v", job.Name, err)
	}
	return &cur
}

// waitStarted waits until the operator started the Job with a fencing token.
func waitStarted(t testing.TB, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	var cur *batchv1.Job
	eventually(t, 30*time.Second, "Job "+job.Name+" to start with a fencing token", func() (bool, string) {
		cur = getJob(t, job)
		return cur.Annotations[locksv1alpha1.AnnotationFencingToken] != "" && !ptr.Deref(cur.Spec.Suspend, true),
			fmt.Sprintf("suspend=%v annotations=%v", ptr.Deref(cur.Spec.Suspend, true), cur.Annotations)
	})
	return cur
}

// cleanupJob deletes a Job at the end of a test and waits until the
// operator released it (its finalizer) and it is gone.
func cleanupJob(t testing.TB, job *batchv1.Job) {
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Job %s: %v", job.Name, err)
		}
	})
}

// fakeServer is a TCP server on a loopback address that answers every read
// with reply(request) and counts what reached it.
type fakeServer struct {
	Addr     string
	accepted atomic.Int64
	bytes    atomic.Int64
	ln       net.Listener
	wg       sync.WaitGroup
}

// startFake starts a fake server on host (127.0.0.1, 127.0.0.2, ...). greet,
// when not empty, is written on accept; reply answers each read (nil: no answer).
func startFake(t testing.TB, host string, greet string, reply func(req []byte) []byte) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listen on %s: %v", host, err)
	}
	s := &fakeServer{Addr: ln.Addr().String(), ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				if greet != "" {
					_, _ = c.Write([]byte(greet))
				}
				r := bufio.NewReader(c)
				buf := make([]byte, 64<<10)
				for {
					n, err := r.Read(buf)
					s.bytes.Add(int64(n))
					if err != nil {
						return
					}
					if reply != nil {
						if out := reply(buf[:n]); out != nil {
							if _, err := c.Write(out); err != nil {
								return
							}
						}
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.wg.Wait()
	})
	return s
}

// blackHole listens on 127.0.0.1 but never accepts: connections complete in
// the kernel and then nothing answers, as with a black-holed address.
func blackHole(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}
