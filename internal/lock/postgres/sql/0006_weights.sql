-- Migration 6: weighted semaphores (Request.Weight).
--
-- A semaphore lease takes weight of its key's slots, 1 to its limit, and a
-- waiter asks for its weight: admission counts weights where it counted
-- rows.
--
--   - slots.weight: the slots the lease takes. The slots taken before this
--     migration take one each (the default), which is what they took.
--   - waiters.weight: the slots the waiter asks for, refreshed each time it
--     calls again. The waiters queued before this migration ask for one (the
--     default): they keep their place and their demand.
--
-- Both columns are added with a constant default: no table rewrite, and an
-- operator of version 5 still running during a rolling upgrade writes rows
-- of weight 1 without naming the column.
--
-- acquire gets a new overload that takes p_weight; the version-5 acquire
-- becomes a call of it with weight 1 (an operator of version 5 keeps taking
-- one slot per lease, counted against the weights the new one takes), and
-- dequeue notifies a key only while some of its slots are free by weight.

ALTER TABLE {{schema}}.slots ADD COLUMN weight int NOT NULL DEFAULT 1 CHECK (weight >= 1);
ALTER TABLE {{schema}}.waiters ADD COLUMN weight int NOT NULL DEFAULT 1 CHECK (weight >= 1);

-- acquire is version 5's (see migration 5) with admission by weight. A
-- semaphore request (p_limit above 1) of weight w (p_weight, at least 1)
-- fits a key, with u the sum of the weights of the key's live slots, a the
-- sum of the weights of the live waiters ahead of it in the queue's order
-- (rank, ticket, owner; all of them when it is not queued) and b the
-- smallest of p_limit and the live slots' limits, only when u + a + w <= b:
-- strict FIFO by weight, a heavy waiter at the head is never passed by
-- lighter ones behind it, even while a slot is free. A mutex request takes
-- weight 1 whatever p_weight says, and its admission is unchanged (a key
-- with any slot or anyone ahead is busy). The slot and the waiter rows keep
-- the request's weight. o_busy_holders still counts leases, not slots.
CREATE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	p_replace boolean, p_preempt boolean, p_boost_us bigint, p_weight int,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int, OUT o_replaced int)
LANGUAGE plpgsql AS $$
DECLARE
	v_now     timestamptz;
	v_row     {{schema}}.locks;
	v_sem     boolean := p_limit > 1;
	v_weight  int := CASE WHEN p_limit > 1 THEN greatest(coalesce(p_weight, 1), 1) ELSE 1 END;
	v_bound   int;
	v_count   int;
	v_used    int;
	v_ahead   int;
	v_ticket  bigint;
	v_rank    bigint;
	v_arrival bigint;
	v_first   {{schema}}.slots;
	v_expiry  timestamptz;
	v_key     bytea;
	i         int;
BEGIN
	IF v_sem AND v_weight > p_limit THEN
		RAISE EXCEPTION 'weight % exceeds the limit %', v_weight, p_limit;
	END IF;
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
		SELECT count(*), coalesce(sum(s.weight), 0), min(s.lim), min(s.expires) INTO v_count, v_used, v_bound, v_expiry
			FROM {{schema}}.slots s WHERE s.key = p_keys[i] AND s.expires > v_now;
		v_bound := least(greatest(p_limit, 1), coalesce(v_bound, greatest(p_limit, 1)));
		SELECT w.rank, w.ticket INTO v_rank, v_ticket FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner;
		IF FOUND THEN
			SELECT coalesce(sum(w.weight), 0) INTO v_ahead FROM {{schema}}.waiters w
				WHERE w.key = p_keys[i] AND (w.rank, w.ticket, w.owner) < (v_rank, v_ticket, p_owner);
		ELSE
			SELECT coalesce(sum(w.weight), 0) INTO v_ahead FROM {{schema}}.waiters w WHERE w.key = p_keys[i];
		END IF;
		IF v_used + v_ahead + v_weight > v_bound THEN
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
			-- Keep the ticket and rank the caller already has on any key, so
			-- that its place does not change; otherwise draw new ones. The
			-- weight is the request's, as it calls now.
			SELECT w.ticket, w.rank INTO v_ticket, v_rank FROM {{schema}}.waiters w
				WHERE w.key = ANY (p_keys) AND w.owner = p_owner ORDER BY w.ticket DESC LIMIT 1;
			IF NOT FOUND THEN
				v_ticket := nextval('{{schema}}.tickets');
				SELECT greatest(floor(extract(epoch FROM v_now) * 1000000)::bigint, max(l.arrival) + 1) INTO v_arrival
					FROM {{schema}}.locks l WHERE l.key = ANY (p_keys);
				UPDATE {{schema}}.locks l SET arrival = v_arrival WHERE l.key = ANY (p_keys);
				v_rank := v_arrival - p_boost_us;
			END IF;
			INSERT INTO {{schema}}.waiters AS w (key, owner, ticket, rank, holder, since, deadline, weight)
				SELECT k, p_owner, v_ticket, v_rank, p_holder, v_now, v_now + p_waiter_ttl_ms * interval '1 millisecond', v_weight
				FROM unnest(p_keys) AS k ORDER BY k
				ON CONFLICT (key, owner) DO UPDATE
					SET ticket = EXCLUDED.ticket, rank = EXCLUDED.rank, deadline = EXCLUDED.deadline, weight = EXCLUDED.weight;
		END IF;
		SELECT count(*) INTO o_waiters FROM {{schema}}.waiters w WHERE w.key = p_keys[o_busy];
		SELECT w.rank, w.ticket INTO v_rank, v_ticket FROM {{schema}}.waiters w WHERE w.key = p_keys[o_busy] AND w.owner = p_owner;
		IF FOUND THEN
			SELECT count(*) INTO o_position FROM {{schema}}.waiters w
				WHERE w.key = p_keys[o_busy] AND (w.rank, w.ticket, w.owner) < (v_rank, v_ticket, p_owner);
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
		INSERT INTO {{schema}}.slots AS s (key, owner, fence, holder, lim, acquired, expires, weight)
			SELECT k, p_owner, o_fence, p_holder, p_limit, v_now, v_now + p_ttl_ms * interval '1 millisecond', v_weight
			FROM unnest(p_keys) AS k ORDER BY k
			ON CONFLICT (key, owner) DO UPDATE
				SET fence = EXCLUDED.fence, holder = EXCLUDED.holder, lim = EXCLUDED.lim,
				    acquired = EXCLUDED.acquired, expires = EXCLUDED.expires, weight = EXCLUDED.weight;
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

-- The version-5 acquire, called by an operator of that version until its pod
-- is gone (and by the older ones through it): the same acquisition with
-- weight 1.
CREATE OR REPLACE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	p_replace boolean, p_preempt boolean, p_boost_us bigint,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int, OUT o_replaced int)
LANGUAGE sql AS $$
	SELECT a.o_ok, a.o_fence, a.o_busy, a.o_busy_holder, a.o_busy_fence, a.o_position, a.o_waiters,
	       a.o_holder_ttl_ms, a.o_busy_holders, a.o_replaced
	FROM {{schema}}.acquire(p_keys, p_owner, p_holder, p_ttl_ms, p_queue, p_waiter_ttl_ms, p_max_fence, p_limit,
	                        p_replace, p_preempt, p_boost_us, 1) a
$$;

-- dequeue is version 5's (see migration 5) with room counted by weight: it
-- notifies a key it leaves when others wait behind it there and the key has
-- room (no live mutex lease, and the live slots' weights below their
-- smallest limit).
CREATE OR REPLACE FUNCTION {{schema}}.dequeue(p_keys bytea[], p_owner text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_ticket bigint;
	v_rank   bigint;
	v_row    {{schema}}.locks;
	v_used   int;
	v_bound  int;
	v_left   int := 0;
	i        int;
BEGIN
	PERFORM 1 FROM {{schema}}.locks l WHERE l.key = ANY (p_keys) ORDER BY l.key FOR UPDATE;
	v_now := clock_timestamp();
	FOR i IN 1 .. cardinality(p_keys) LOOP
		DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner
			RETURNING w.rank, w.ticket INTO v_rank, v_ticket;
		IF FOUND THEN
			v_left := v_left + 1;
			DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.deadline < v_now;
			SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
			SELECT coalesce(sum(s.weight), 0), min(s.lim) INTO v_used, v_bound
				FROM {{schema}}.slots s WHERE s.key = p_keys[i] AND s.expires > v_now;
			IF NOT (v_row.owner IS NOT NULL AND v_row.expires > v_now)
			   AND (v_used = 0 OR v_used < v_bound)
			   AND EXISTS (SELECT 1 FROM {{schema}}.waiters w
			               WHERE w.key = p_keys[i] AND (w.rank, w.ticket, w.owner) > (v_rank, v_ticket, p_owner)) THEN
				PERFORM pg_notify({{channel}}, encode(p_keys[i], 'hex'));
			END IF;
		END IF;
	END LOOP;
	RETURN v_left;
END
$$;
