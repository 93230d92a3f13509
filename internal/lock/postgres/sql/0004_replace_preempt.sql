-- Migration 4: the queue rules Request.Replace and Request.Preempt.
--
-- Both marks are rows (or a column) written in the transaction of the
-- acquisition that sets them, under the row locks of its keys, so they hold
-- between every operator sharing the database and survive a reconnect, a
-- restart of the server and (with synchronous replication) a failover, as
-- leases do.
--
--   - replaced: the owners a request with Replace dropped from a key's
--     queue, each until a deadline (two waiter TTLs of the replacing
--     request); while it lasts, the owner's acquisitions of the key are told
--     so (o_replaced) instead of joining the queue again.
--   - locks.preempted: the largest fencing token a request with Preempt
--     stopped on the key. A lease (mutex or slot) whose token is at or below
--     it is preempted: renew extends none of its keys and says so, and it is
--     never shortened or released by it. Tokens only grow, so leases taken
--     later are never preempted by an old mark; the column is never reset.
--
-- acquire gets a new overload that takes the two flags and returns
-- o_replaced; the version-3 acquire becomes a call of it without them, so an
-- operator of version 3 still running during a rolling upgrade obeys the
-- marks the new one sets (a replaced version-3 waiter is refused, not
-- queued, until its mark ends: it cannot tell ErrReplaced). renew keeps its
-- signature and tells a preempted lease by a negative result (minus the
-- position of the first preempted key): a version-3 operator reads any
-- non-zero result as a lost lease and stops, which is what preemption asks.

ALTER TABLE {{schema}}.locks ADD COLUMN preempted bigint NOT NULL DEFAULT 0;

-- One row per replaced owner and key; until is when the mark ends.
CREATE TABLE {{schema}}.replaced (
	key   bytea NOT NULL,
	owner text NOT NULL,
	until timestamptz NOT NULL,
	PRIMARY KEY (key, owner)
);

-- acquire is version 3's (see migration 3) with two rules first, after the
-- row locks and the pruning (expired waiters, slots and replacement marks):
--   - p_owner marked replaced on one of the keys: nothing else happens; it
--     returns o_replaced, and o_busy, the index (1-based) of that key, with
--     o_position -1 (not queued).
--   - p_replace: the waiters of the keys queued before p_owner (a smaller
--     ticket than its own; all of them when it is not queued) are deleted,
--     each marked replaced for two p_waiter_ttl_ms, and each key that lost
--     one is notified, so that a waiting Acquire learns it at once.
--   - p_preempt: on every key, the live leases of other owners (mutex or
--     slots) are preempted: locks.preempted rises to their largest token.
-- Then, as in version 3, except that the owner's own live mutex lease no
-- longer leaves the key to it when the lease is preempted and another
-- owner waits in the key's queue: a preempted holder does not escape by
-- acquiring its key anew.
CREATE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	p_replace boolean, p_preempt boolean,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int, OUT o_replaced int)
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_row    {{schema}}.locks;
	v_sem    boolean := p_limit > 1;
	v_bound  int;
	v_count  int;
	v_place  int;
	v_ticket bigint;
	v_first  {{schema}}.slots;
	v_expiry timestamptz;
	v_key    bytea;
	i        int;
BEGIN
	INSERT INTO {{schema}}.locks (key) SELECT k FROM unnest(p_keys) AS k ORDER BY k ON CONFLICT DO NOTHING;
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	DELETE FROM {{schema}}.waiters w WHERE w.key = ANY (p_keys) AND w.deadline < v_now;
	DELETE FROM {{schema}}.slots s WHERE s.key = ANY (p_keys) AND s.expires <= v_now;
	DELETE FROM {{schema}}.replaced r WHERE r.key = ANY (p_keys) AND r.until < v_now;

	o_ok := false; o_fence := 0; o_busy := 0; o_busy_holder := ''; o_busy_fence := 0;
	o_position := -1; o_waiters := 0; o_holder_ttl_ms := 0; o_busy_holders := 0; o_replaced := 0;

	SELECT min(x.ord) INTO o_replaced
		FROM unnest(p_keys) WITH ORDINALITY AS x(key, ord)
		JOIN {{schema}}.replaced r ON r.key = x.key AND r.owner = p_owner;
	IF o_replaced IS NOT NULL THEN
		o_busy := o_replaced;
		SELECT count(*) INTO o_waiters FROM {{schema}}.waiters w WHERE w.key = p_keys[o_busy];
		RETURN;
	END IF;
	o_replaced := 0;

	IF p_replace THEN
		SELECT max(w.ticket) INTO v_ticket FROM {{schema}}.waiters w
			WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
		FOR v_key IN
			WITH dropped AS (
				DELETE FROM {{schema}}.waiters w
					WHERE w.key = ANY (p_keys) AND w.owner <> p_owner
					  AND (v_ticket IS NULL OR w.ticket < v_ticket)
					RETURNING w.key, w.owner
			), marked AS (
				INSERT INTO {{schema}}.replaced AS r (key, owner, until)
					SELECT d.key, d.owner, v_now + 2 * p_waiter_ttl_ms * interval '1 millisecond' FROM dropped d
					ON CONFLICT (key, owner) DO UPDATE SET until = greatest(r.until, EXCLUDED.until)
			)
			SELECT DISTINCT d.key FROM dropped d
		LOOP
			PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
		END LOOP;
	END IF;

	IF p_preempt THEN
		UPDATE {{schema}}.locks l
			SET preempted = greatest(l.preempted, h.fence)
			FROM (
				SELECT x.key, max(x.fence) AS fence FROM (
					SELECT m.key, m.fence FROM {{schema}}.locks m
						WHERE m.key = ANY (p_keys) AND m.owner IS NOT NULL AND m.owner <> p_owner AND m.expires > v_now
					UNION ALL
					SELECT s.key, s.fence FROM {{schema}}.slots s
						WHERE s.key = ANY (p_keys) AND s.owner <> p_owner AND s.expires > v_now
				) x GROUP BY x.key
			) h
			WHERE l.key = h.key AND h.fence > l.preempted;
	END IF;

	FOR i IN 1 .. cardinality(p_keys) LOOP
		SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
		IF v_row.owner IS NOT NULL AND v_row.expires > v_now THEN
			-- A mutex lease holds the key whole; the owner's own, unless
			-- preempted while others wait, is taken again by a mutex request.
			IF v_sem OR v_row.owner <> p_owner
			   OR (v_row.fence <= v_row.preempted
			       AND EXISTS (SELECT 1 FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner <> p_owner)) THEN
				o_busy := i;
				o_busy_holders := 1;
				o_busy_holder := v_row.holder;
				o_busy_fence := v_row.fence;
				o_holder_ttl_ms := ceil(extract(epoch FROM v_row.expires - v_now) * 1000)::bigint;
				EXIT;
			END IF;
			CONTINUE;
		END IF;
		IF v_sem AND EXISTS (SELECT 1 FROM {{schema}}.slots s
		                     WHERE s.key = p_keys[i] AND s.owner = p_owner AND s.expires > v_now) THEN
			CONTINUE;
		END IF;
		SELECT count(*), min(s.lim), min(s.expires) INTO v_count, v_bound, v_expiry
			FROM {{schema}}.slots s WHERE s.key = p_keys[i] AND s.expires > v_now;
		v_bound := least(greatest(p_limit, 1), coalesce(v_bound, greatest(p_limit, 1)));
		SELECT w.ticket INTO v_ticket FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner;
		IF FOUND THEN
			SELECT count(*) INTO v_place FROM {{schema}}.waiters w
				WHERE w.key = p_keys[i] AND (w.ticket, w.owner) < (v_ticket, p_owner);
		ELSE
			SELECT count(*) INTO v_place FROM {{schema}}.waiters w WHERE w.key = p_keys[i];
		END IF;
		IF v_place >= v_bound - v_count THEN
			o_busy := i;
			o_busy_holders := v_count;
			IF v_count > 0 THEN
				SELECT * INTO v_first FROM {{schema}}.slots s
					WHERE s.key = p_keys[i] AND s.expires > v_now ORDER BY s.fence LIMIT 1;
				o_busy_holder := v_first.holder;
				o_busy_fence := v_first.fence;
				o_holder_ttl_ms := ceil(extract(epoch FROM v_expiry - v_now) * 1000)::bigint;
			END IF;
			EXIT;
		END IF;
	END LOOP;

	IF o_busy > 0 THEN
		IF p_queue THEN
			-- Keep the ticket the caller already has on any key, so that its
			-- place does not change; otherwise draw a new one.
			SELECT max(w.ticket) INTO v_ticket FROM {{schema}}.waiters w
				WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
			IF v_ticket IS NULL THEN
				v_ticket := nextval('{{schema}}.tickets');
			END IF;
			INSERT INTO {{schema}}.waiters AS w (key, owner, ticket, holder, since, deadline)
				SELECT k, p_owner, v_ticket, p_holder, v_now, v_now + p_waiter_ttl_ms * interval '1 millisecond'
				FROM unnest(p_keys) AS k ORDER BY k
				ON CONFLICT (key, owner) DO UPDATE SET ticket = EXCLUDED.ticket, deadline = EXCLUDED.deadline;
		END IF;
		SELECT count(*) INTO o_waiters FROM {{schema}}.waiters w WHERE w.key = p_keys[o_busy];
		SELECT w.ticket INTO v_ticket FROM {{schema}}.waiters w WHERE w.key = p_keys[o_busy] AND w.owner = p_owner;
		IF FOUND THEN
			SELECT count(*) INTO o_position FROM {{schema}}.waiters w
				WHERE w.key = p_keys[o_busy] AND (w.ticket, w.owner) < (v_ticket, p_owner);
		END IF;
		RETURN;
	END IF;

	SELECT max(l.fence) + 1 INTO o_fence FROM {{schema}}.locks l WHERE l.key = ANY (p_keys);
	IF o_fence > p_max_fence THEN
		RAISE EXCEPTION 'fencing token % would exceed %', o_fence, p_max_fence;
	END IF;
	IF v_sem THEN
		-- The locks row keeps the key's counter; no mutex lease is live on it.
		UPDATE {{schema}}.locks l
			SET fence = o_fence, owner = NULL, holder = '', acquired = NULL, expires = NULL, version = l.version + 1
			WHERE l.key = ANY (p_keys);
		INSERT INTO {{schema}}.slots AS s (key, owner, fence, holder, lim, acquired, expires)
			SELECT k, p_owner, o_fence, p_holder, p_limit, v_now, v_now + p_ttl_ms * interval '1 millisecond'
			FROM unnest(p_keys) AS k ORDER BY k
			ON CONFLICT (key, owner) DO UPDATE
				SET fence = EXCLUDED.fence, holder = EXCLUDED.holder, lim = EXCLUDED.lim,
				    acquired = EXCLUDED.acquired, expires = EXCLUDED.expires;
	ELSE
		UPDATE {{schema}}.locks l
			SET fence = o_fence, owner = p_owner, holder = p_holder, version = l.version + 1,
			    acquired = v_now, expires = v_now + p_ttl_ms * interval '1 millisecond'
			WHERE l.key = ANY (p_keys);
	END IF;
	DELETE FROM {{schema}}.waiters w WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
	o_ok := true;
END
$$;

-- The version-3 acquire, called by an operator of that version until its pod
-- is gone: the same acquisition without Replace or Preempt. A replaced owner
-- gets a busy key without a place in its queue (o_position -1).
CREATE OR REPLACE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int)
LANGUAGE sql AS $$
	SELECT a.o_ok, a.o_fence, a.o_busy, a.o_busy_holder, a.o_busy_fence, a.o_position, a.o_waiters,
	       a.o_holder_ttl_ms, a.o_busy_holders
	FROM {{schema}}.acquire(p_keys, p_owner, p_holder, p_ttl_ms, p_queue, p_waiter_ttl_ms, p_max_fence, p_limit, false, false) a
$$;

-- renew is version 3's (see migration 3), with preemption: a lease that
-- holds every one of its keys but is preempted on one of them (its token at
-- or below the key's locks.preempted) is neither extended nor released, and
-- its result is minus the 1-based position of the first such key. A lost
-- lease (a positive result) is released as before, preempted or not.
CREATE OR REPLACE FUNCTION {{schema}}.renew(p_lease int[], p_keys bytea[], p_owners text[], p_fences bigint[], p_ttl_ms bigint)
RETURNS TABLE (o_lease int, o_lost int)
LANGUAGE plpgsql AS $$
DECLARE
	v_now     timestamptz;
	v_expires timestamptz;
	v_leases  int[];
	v_lost    int[];
	v_ok      int[];
	v_bad     int[];
	v_key     bytea;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	v_expires := v_now + p_ttl_ms * interval '1 millisecond';
	SELECT array_agg(s.lease ORDER BY s.lease), array_agg(coalesce(s.lost, -s.preempted, 0) ORDER BY s.lease),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NULL AND s.preempted IS NULL), '{}'),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NOT NULL), '{}')
		INTO v_leases, v_lost, v_ok, v_bad
		FROM (
			SELECT u.lease,
			       min(u.pos) FILTER (WHERE NOT (
			           coalesce(l.owner = p_owners[u.lease] AND l.fence = p_fences[u.lease] AND l.expires > v_now, false)
			           OR coalesce(t.fence = p_fences[u.lease] AND t.expires > v_now, false))) AS lost,
			       min(u.pos) FILTER (WHERE p_fences[u.lease] <= l.preempted) AS preempted
			FROM (SELECT x.lease, x.key, row_number() OVER (PARTITION BY x.lease ORDER BY x.ord) AS pos
			      FROM unnest(p_lease, p_keys) WITH ORDINALITY AS x(lease, key, ord)) u
			LEFT JOIN {{schema}}.locks l ON l.key = u.key
			LEFT JOIN {{schema}}.slots t ON t.key = u.key AND t.owner = p_owners[u.lease]
			GROUP BY u.lease
		) s;
	UPDATE {{schema}}.locks l
		SET expires = v_expires, version = l.version + 1
		FROM unnest(p_lease, p_keys) AS x(lease, key)
		WHERE l.key = x.key AND x.lease = ANY (v_ok)
		  AND l.owner = p_owners[x.lease] AND l.fence = p_fences[x.lease] AND l.expires > v_now;
	UPDATE {{schema}}.slots t
		SET expires = v_expires
		FROM unnest(p_lease, p_keys) AS x(lease, key)
		WHERE t.key = x.key AND t.owner = p_owners[x.lease] AND x.lease = ANY (v_ok)
		  AND t.fence = p_fences[x.lease] AND t.expires > v_now;
	FOR v_key IN
		UPDATE {{schema}}.locks l
			SET owner = NULL, holder = '', acquired = NULL, expires = NULL, version = l.version + 1
			FROM unnest(p_lease, p_keys) AS x(lease, key)
			WHERE l.key = x.key AND x.lease = ANY (v_bad) AND l.owner = p_owners[x.lease]
			  AND l.fence = p_fences[x.lease] AND l.expires > v_now
			RETURNING l.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
	END LOOP;
	FOR v_key IN
		DELETE FROM {{schema}}.slots t
			USING unnest(p_lease, p_keys) AS x(lease, key)
			WHERE t.key = x.key AND t.owner = p_owners[x.lease] AND x.lease = ANY (v_bad)
			  AND t.fence = p_fences[x.lease] AND t.expires > v_now
			RETURNING t.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
	END LOOP;
	RETURN QUERY SELECT a.l, a.p FROM unnest(v_leases, v_lost) AS a(l, p);
END
$$;
