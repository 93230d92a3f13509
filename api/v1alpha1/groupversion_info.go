// Package v1alpha1 contains the API of lockwarden: the DistributedLock kind in
// the locks.lockwarden.io group.
//
// +kubebuilder:object:generate=true
// +groupName=locks.lockwarden.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "locks.lockwarden.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this group-version.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &DistributedLock{}, &DistributedLockList{}, &ClusterLockBackend{}, &ClusterLockBackendList{}, &LockBackend{}, &LockBackendList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
