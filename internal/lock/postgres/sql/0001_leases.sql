-- Migration 1: the lease tables and the functions that change them.
--
-- {{schema}} is the schema as a quoted identifier, {{channel}} the NOTIFY
-- channel as a string literal; migrate.go substitutes both (the schema name is
-- validated as a plain identifier before). Every function takes the rows of
-- the keys it touches with SELECT ... ORDER BY key FOR UPDATE before it reads
-- or writes them (acquire first inserts the missing rows, in the same order),
-- so two calls on overlapping keys never deadlock whatever order their keys
-- came in. Times are the database's clock_timestamp(), read after the row
-- locks are held, never the client's clock.

-- One row per key ever used. fence is the last fencing token issued for the
-- key: rows are never deleted, so it never goes backwards. owner is NULL when
-- the key is free; a lease whose expires has passed is free too (the row keeps
-- its owner until the next writer).
CREATE TABLE {{schema}}.locks (
	key      bytea PRIMARY KEY,
	fence    bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
	owner    text,
	holder   text NOT NULL DEFAULT '',
	version  bigint NOT NULL DEFAULT 0,
	acquired timestamptz,
	expires  timestamptz
);

-- The FIFO queues: one row per waiting owner and key. ticket comes from one
-- sequence, so a multi-key waiter has the same place relative to the others on
-- every key; deadline is when the waiter is dead unless it calls again.
CREATE TABLE {{schema}}.waiters (
	key      bytea NOT NULL,
	owner    text NOT NULL,
	ticket   bigint NOT NULL,
	holder   text NOT NULL,
	since    timestamptz NOT NULL,
	deadline timestamptz NOT NULL,
	PRIMARY KEY (key, owner)
);
CREATE INDEX waiters_queue ON {{schema}}.waiters (key, ticket, owner);
CREATE SEQUENCE {{schema}}.tickets;

-- acquire takes every key for p_owner or none. A key is free for p_owner when
-- no live lease of another owner holds it and its queue (after pruning dead
-- waiters) is empty or has p_owner at its head. The new fencing token is the
-- largest fence of the keys plus one. When a key is busy it returns the first
-- busy key (1-based in p_keys order), its holder, fence and remaining TTL, the
-- caller's position in its queue (-1: not queued) and the queue length; with
-- p_queue the caller joins (or refreshes its place in) every key's queue.
CREATE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint)
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_row    {{schema}}.locks;
	v_head   text;
	v_ticket bigint;
	i        int;
BEGIN
	INSERT INTO {{schema}}.locks (key) SELECT k FROM unnest(p_keys) AS k ORDER BY k ON CONFLICT DO NOTHING;
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	DELETE FROM {{schema}}.waiters w WHERE w.key = ANY (p_keys) AND w.deadline < v_now;

	o_ok := false; o_fence := 0; o_busy := 0; o_busy_holder := ''; o_busy_fence := 0;
	o_position := -1; o_waiters := 0; o_holder_ttl_ms := 0;
	FOR i IN 1 .. cardinality(p_keys) LOOP
		SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
		IF v_row.owner IS NOT NULL AND v_row.expires > v_now THEN
			-- Held: busy unless it is the caller's own lease (taken again).
			IF v_row.owner <> p_owner THEN
				o_busy := i;
				o_busy_holder := v_row.holder;
				o_busy_fence := v_row.fence;
				o_holder_ttl_ms := ceil(extract(epoch FROM v_row.expires - v_now) * 1000)::bigint;
				EXIT;
			END IF;
		ELSE
			SELECT w.owner INTO v_head FROM {{schema}}.waiters w
				WHERE w.key = p_keys[i] ORDER BY w.ticket, w.owner LIMIT 1;
			IF FOUND AND v_head <> p_owner THEN
				o_busy := i;
				EXIT;
			END IF;
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
	UPDATE {{schema}}.locks l
		SET fence = o_fence, owner = p_owner, holder = p_holder, version = l.version + 1,
		    acquired = v_now, expires = v_now + p_ttl_ms * interval '1 millisecond'
		WHERE l.key = ANY (p_keys);
	DELETE FROM {{schema}}.waiters w WHERE w.key = ANY (p_keys) AND w.owner = p_owner;
	o_ok := true;
END
$$;

-- renew extends many leases at once: lease p_lease[i] owns key p_keys[i], and
-- p_owners[n] is lease n's owner token. A lease is renewed when its owner
-- holds every one of its keys with a live lease; otherwise it is lost, and the
-- keys it still held are released (and notified) instead. Returns one row per
-- lease: 0 when renewed, else the 1-based position (within the lease's keys)
-- of the first key it no longer held.
CREATE FUNCTION {{schema}}.renew(p_lease int[], p_keys bytea[], p_owners text[], p_ttl_ms bigint)
RETURNS TABLE (o_lease int, o_lost int)
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_leases int[];
	v_lost   int[];
	v_ok     int[];
	v_bad    int[];
	v_key    bytea;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	SELECT array_agg(s.lease ORDER BY s.lease), array_agg(coalesce(s.lost, 0) ORDER BY s.lease),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NULL), '{}'),
	       coalesce(array_agg(s.lease) FILTER (WHERE s.lost IS NOT NULL), '{}')
		INTO v_leases, v_lost, v_ok, v_bad
		FROM (
			SELECT u.lease,
			       min(u.pos) FILTER (WHERE l.key IS NULL OR l.owner IS DISTINCT FROM p_owners[u.lease] OR l.expires <= v_now) AS lost
			FROM (SELECT x.lease, x.key, row_number() OVER (PARTITION BY x.lease ORDER BY x.ord) AS pos
			      FROM unnest(p_lease, p_keys) WITH ORDINALITY AS x(lease, key, ord)) u
			LEFT JOIN {{schema}}.locks l ON l.key = u.key
			GROUP BY u.lease
		) s;
	UPDATE {{schema}}.locks l
		SET expires = v_now + p_ttl_ms * interval '1 millisecond', version = l.version + 1
		FROM unnest(p_lease, p_keys) AS x(lease, key)
		WHERE l.key = x.key AND x.lease = ANY (v_ok);
	FOR v_key IN
		UPDATE {{schema}}.locks l
			SET owner = NULL, holder = '', acquired = NULL, expires = NULL, version = l.version + 1
			FROM unnest(p_lease, p_keys) AS x(lease, key)
			WHERE l.key = x.key AND x.lease = ANY (v_bad) AND l.owner = p_owners[x.lease] AND l.expires > v_now
			RETURNING l.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
	END LOOP;
	RETURN QUERY SELECT a.l, a.p FROM unnest(v_leases, v_lost) AS a(l, p);
END
$$;

-- release frees the keys p_owner holds with a live lease and notifies each
-- one. Returns how many it freed.
CREATE FUNCTION {{schema}}.release(p_keys bytea[], p_owner text) RETURNS int
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
			WHERE l.key = ANY (p_keys) AND l.owner = p_owner AND l.expires > v_now
			RETURNING l.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
		v_n := v_n + 1;
	END LOOP;
	RETURN v_n;
END
$$;

-- dequeue removes p_owner from the keys' queues (and prunes dead waiters).
-- When it was at the head of a free key's queue and others still wait, it
-- notifies the key so that the next waiter tries at once. Returns how many
-- queues it left.
CREATE FUNCTION {{schema}}.dequeue(p_keys bytea[], p_owner text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	v_now  timestamptz;
	v_head text;
	v_row  {{schema}}.locks;
	v_left int := 0;
	i      int;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	FOR i IN 1 .. cardinality(p_keys) LOOP
		SELECT w.owner INTO v_head FROM {{schema}}.waiters w
			WHERE w.key = p_keys[i] AND w.deadline >= v_now ORDER BY w.ticket, w.owner LIMIT 1;
		DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner;
		IF FOUND THEN
			v_left := v_left + 1;
			DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.deadline < v_now;
			SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
			IF v_head = p_owner AND NOT (v_row.owner IS NOT NULL AND v_row.expires > v_now)
			   AND EXISTS (SELECT 1 FROM {{schema}}.waiters w WHERE w.key = p_keys[i]) THEN
				PERFORM pg_notify({{channel}}, encode(p_keys[i], 'hex'));
			END IF;
		END IF;
	END LOOP;
	RETURN v_left;
END
$$;
