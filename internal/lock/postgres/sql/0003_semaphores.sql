-- Migration 3: counting semaphores (a request's limit above 1).
--
-- A key is held either by one mutex lease (its locks row, as before) or by
-- up to N semaphore leases, each a row of slots. Slot rows change only while
-- their key's locks row is locked (every function locks those rows first, in
-- key order, as before), so the locks row still serializes everything done
-- to a key, and locks.fence stays the one durable counter of the key's
-- fencing tokens, for mutex and semaphore leases alike. A slot is held while
-- its expires has not passed by the database clock; an expired slot is free
-- whether or not its row is still there (the next acquisition of the key
-- deletes it).
--
-- The functions the running operator calls keep their signatures and are
-- replaced (renew, release, dequeue): they now handle slots too, and an
-- operator of schema version 2 still running during a rolling upgrade calls
-- them unchanged. acquire gets a new overload that takes the limit; the
-- version-2 acquire becomes a mutex acquisition through it, so that an
-- operator of version 2 never takes a key that slots hold.

-- One row per semaphore holder and key. owner is the owner token's digest,
-- as in locks; lim is the limit the lease was acquired with: a key admits no
-- more holders than the smallest lim of its live slots (and the newcomer's).
CREATE TABLE {{schema}}.slots (
	key      bytea NOT NULL,
	owner    text NOT NULL,
	fence    bigint NOT NULL CHECK (fence > 0),
	holder   text NOT NULL,
	lim      int NOT NULL CHECK (lim > 1),
	acquired timestamptz NOT NULL,
	expires  timestamptz NOT NULL,
	PRIMARY KEY (key, owner)
);
CREATE INDEX slots_by_fence ON {{schema}}.slots (key, fence);

-- acquire takes every key for p_owner or none: with p_limit 0 or 1 as the
-- key's only (mutex) holder, with p_limit above 1 as one of its semaphore
-- holders. For each key, in p_keys order:
--   - a live mutex lease of another owner makes the key busy; one of p_owner
--     is taken again by a mutex request (a new token) and makes a semaphore
--     request busy;
--   - a live slot of p_owner is taken again by a semaphore request;
--   - otherwise, with c live slots, bound b the smallest of p_limit (at least
--     1) and the live slots' limits, and p the caller's place in the key's
--     live queue (the queue's length when it is not queued), the key is busy
--     unless p < b - c: a waiter takes one of the free slots only while fewer
--     waiters are ahead of it than slots are free, and a mutex request needs
--     the key free of slots and its queue empty or headed by the caller.
-- The new fencing token is the largest fence of the keys plus one, written
-- to every key's locks row. When a key is busy it returns the first busy
-- key (1-based), the number of live holders there (o_busy_holders), the
-- oldest one's holder and fence (by fence), the time until a holder's lease
-- ends, the caller's position in the key's queue (-1: not queued) and the
-- queue's length; with p_queue the caller joins (or refreshes its place in)
-- every key's queue.
CREATE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int)
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
	i        int;
BEGIN
	INSERT INTO {{schema}}.locks (key) SELECT k FROM unnest(p_keys) AS k ORDER BY k ON CONFLICT DO NOTHING;
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	DELETE FROM {{schema}}.waiters w WHERE w.key = ANY (p_keys) AND w.deadline < v_now;
	DELETE FROM {{schema}}.slots s WHERE s.key = ANY (p_keys) AND s.expires <= v_now;

	o_ok := false; o_fence := 0; o_busy := 0; o_busy_holder := ''; o_busy_fence := 0;
	o_position := -1; o_waiters := 0; o_holder_ttl_ms := 0; o_busy_holders := 0;
	FOR i IN 1 .. cardinality(p_keys) LOOP
		SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
		IF v_row.owner IS NOT NULL AND v_row.expires > v_now THEN
			-- A mutex lease holds the key whole.
			IF v_sem OR v_row.owner <> p_owner THEN
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

-- The version-2 acquire, called by an operator of that version until its pod
-- is gone: a mutex acquisition, which slots make wait like any holder.
CREATE OR REPLACE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint)
LANGUAGE sql AS $$
	SELECT a.o_ok, a.o_fence, a.o_busy, a.o_busy_holder, a.o_busy_fence, a.o_position, a.o_waiters, a.o_holder_ttl_ms
	FROM {{schema}}.acquire(p_keys, p_owner, p_holder, p_ttl_ms, p_queue, p_waiter_ttl_ms, p_max_fence, 1) a
$$;

-- renew extends many leases at once: lease p_lease[i] owns key p_keys[i], and
-- p_owners[n] and p_fences[n] are lease n's owner token and fencing token. A
-- lease holds a key when the key's locks row (a mutex lease) or the owner's
-- slot of the key (a semaphore lease) is live with that owner and token:
-- either kind, so that a lease named with another limit than it was
-- acquired with (the lock's limit changed meanwhile) is still found. A
-- lease is renewed when it holds every one of its keys; otherwise it is
-- lost, and the keys it still held are released (and notified) instead.
-- Returns one row per lease: 0 when renewed, else the 1-based position
-- (within the lease's keys) of the first key it no longer held.
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
	SELECT array_agg(s.lease ORDER BY s.lease), array_agg(coalesce(s.lost, 0) ORDER BY s.lease),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NULL), '{}'),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NOT NULL), '{}')
		INTO v_leases, v_lost, v_ok, v_bad
		FROM (
			SELECT u.lease,
			       min(u.pos) FILTER (WHERE NOT (
			           coalesce(l.owner = p_owners[u.lease] AND l.fence = p_fences[u.lease] AND l.expires > v_now, false)
			           OR coalesce(t.fence = p_fences[u.lease] AND t.expires > v_now, false))) AS lost
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

-- release frees the keys p_owner holds with a live lease of fencing token
-- p_fence, mutex or semaphore slot (either kind, as renew), and notifies each
-- one. Returns how many it freed.
CREATE OR REPLACE FUNCTION {{schema}}.release(p_keys bytea[], p_owner text, p_fence bigint) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	v_now timestamptz;
	v_key bytea;
	v_n   int := 0;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	FOR v_key IN
		UPDATE {{schema}}.locks l
			SET owner = NULL, holder = '', acquired = NULL, expires = NULL, version = l.version + 1
			WHERE l.key = ANY (p_keys) AND l.owner = p_owner AND l.fence = p_fence AND l.expires > v_now
			RETURNING l.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
		v_n := v_n + 1;
	END LOOP;
	-- An expired slot of the lease goes too, but was no longer held.
	FOR v_key IN
		DELETE FROM {{schema}}.slots t
			WHERE t.key = ANY (p_keys) AND t.owner = p_owner AND t.fence = p_fence
			RETURNING CASE WHEN t.expires > v_now THEN t.key END
	LOOP
		IF v_key IS NOT NULL THEN
			PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
			v_n := v_n + 1;
		END IF;
	END LOOP;
	RETURN v_n;
END
$$;

-- dequeue removes p_owner from the keys' queues (and prunes dead waiters).
-- When others still wait behind it on a key that no mutex lease holds and
-- whose slots are not all taken, it notifies the key, so that they try at
-- once: the head of a free key's queue, or (on a semaphore) a waiter that
-- moved up to a free slot.
-- Returns how many queues it left.
CREATE OR REPLACE FUNCTION {{schema}}.dequeue(p_keys bytea[], p_owner text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_ticket bigint;
	v_row    {{schema}}.locks;
	v_count  int;
	v_bound  int;
	v_left   int := 0;
	i        int;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	FOR i IN 1 .. cardinality(p_keys) LOOP
		DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner
			RETURNING w.ticket INTO v_ticket;
		IF FOUND THEN
			v_left := v_left + 1;
			DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.deadline < v_now;
			SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
			SELECT count(*), min(s.lim) INTO v_count, v_bound
				FROM {{schema}}.slots s WHERE s.key = p_keys[i] AND s.expires > v_now;
			IF NOT (v_row.owner IS NOT NULL AND v_row.expires > v_now)
			   AND (v_count = 0 OR v_count < v_bound)
			   AND EXISTS (SELECT 1 FROM {{schema}}.waiters w
			               WHERE w.key = p_keys[i] AND (w.ticket, w.owner) > (v_ticket, p_owner)) THEN
				PERFORM pg_notify({{channel}}, encode(p_keys[i], 'hex'));
			END IF;
		END IF;
	END LOOP;
	RETURN v_left;
END
$$;
