-- Migration 5: priority with aging (Request.Boost), as a rule of the queue.
--
-- A key's queue is ordered by rank, then ticket: a waiter's rank is its
-- arrival (the database's clock_timestamp(), in microseconds, kept from
-- going back on each of its keys) less its head start (p_boost_us), drawn
-- with its ticket when it joins and kept, like the ticket, while it calls
-- again. Equal boosts keep the order of arrival exactly; a waiter is
-- overtaken only by requests that arrive less than their boost after it.
--
--   - waiters.rank: the waiter's place in the order. The waiters queued
--     before this migration get their since (when they joined, on the same
--     clock) as rank, as if they had joined without a boost: they keep their
--     order, the requests without a boost that come after them queue behind
--     them, and a boosted one passes them by no more than its boost.
--   - locks.arrival: the last arrival (microseconds) given on the key, so
--     that a clock going back (a step of the server's clock, a failover to
--     a server whose clock is behind) never puts a later waiter ahead of an
--     earlier one with the same boost: an arrival is the larger of now and
--     the last arrival on any of its keys plus one. It is seeded from the
--     ranks of the waiters already queued.
--
-- acquire gets a new overload that takes p_boost_us; the version-4 acquire
-- becomes a call of it without a boost (an operator of version 4 still
-- running during a rolling upgrade queues its waiters by arrival, in the
-- same order as everyone's), and dequeue notifies by the new order.
-- Request.Replace still compares tickets (arrival order), not ranks.

ALTER TABLE {{schema}}.waiters ADD COLUMN rank bigint;
UPDATE {{schema}}.waiters SET rank = floor(extract(epoch FROM since) * 1000000)::bigint;
ALTER TABLE {{schema}}.waiters ALTER COLUMN rank SET NOT NULL;
ALTER TABLE {{schema}}.locks ADD COLUMN arrival bigint NOT NULL DEFAULT 0;
UPDATE {{schema}}.locks l SET arrival = w.rank
	FROM (SELECT key, max(rank) AS rank FROM {{schema}}.waiters GROUP BY key) w
	WHERE l.key = w.key;
-- The queue order, as the ticket order was (waiters_queue).
DROP INDEX {{schema}}.waiters_queue;
CREATE INDEX waiters_rank ON {{schema}}.waiters (key, rank, ticket, owner);

-- acquire is version 4's (see migration 4) with the queue ordered by
-- (rank, ticket, owner) instead of (ticket, owner): the place of a queued
-- request (its admission to a free key or slot, and o_position) counts the
-- waiters ahead of it in that order. A request that joins draws a ticket,
-- an arrival and its rank (arrival - p_boost_us), and moves the arrival of
-- its keys' locks rows; one already queued keeps the ticket and rank it has
-- (those of its largest ticket on the keys), whatever p_boost_us it brings.
CREATE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	p_replace boolean, p_preempt boolean, p_boost_us bigint,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int, OUT o_replaced int)
LANGUAGE plpgsql AS $$
DECLARE
	v_now     timestamptz;
	v_row     {{schema}}.locks;
	v_sem     boolean := p_limit > 1;
	v_bound   int;
	v_count   int;
	v_place   int;
	v_ticket  bigint;
	v_rank    bigint;
	v_arrival bigint;
	v_first   {{schema}}.slots;
	v_expiry  timestamptz;
	v_key     bytea;
	i         int;
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
		SELECT w.rank, w.ticket INTO v_rank, v_ticket FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.owner = p_owner;
		IF FOUND THEN
			SELECT count(*) INTO v_place FROM {{schema}}.waiters w
				WHERE w.key = p_keys[i] AND (w.rank, w.ticket, w.owner) < (v_rank, v_ticket, p_owner);
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
			-- Keep the ticket and rank the caller already has on any key, so
			-- that its place does not change; otherwise draw new ones.
			SELECT w.ticket, w.rank INTO v_ticket, v_rank FROM {{schema}}.waiters w
				WHERE w.key = ANY (p_keys) AND w.owner = p_owner ORDER BY w.ticket DESC LIMIT 1;
			IF NOT FOUND THEN
				v_ticket := nextval('{{schema}}.tickets');
				SELECT greatest(floor(extract(epoch FROM v_now) * 1000000)::bigint, max(l.arrival) + 1) INTO v_arrival
					FROM {{schema}}.locks l WHERE l.key = ANY (p_keys);
				UPDATE {{schema}}.locks l SET arrival = v_arrival WHERE l.key = ANY (p_keys);
				v_rank := v_arrival - p_boost_us;
			END IF;
			INSERT INTO {{schema}}.waiters AS w (key, owner, ticket, rank, holder, since, deadline)
				SELECT k, p_owner, v_ticket, v_rank, p_holder, v_now, v_now + p_waiter_ttl_ms * interval '1 millisecond'
				FROM unnest(p_keys) AS k ORDER BY k
				ON CONFLICT (key, owner) DO UPDATE SET ticket = EXCLUDED.ticket, rank = EXCLUDED.rank, deadline = EXCLUDED.deadline;
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

-- The version-4 acquire, called by an operator of that version until its pod
-- is gone (and by the version-3 one through it): the same acquisition
-- without a boost.
CREATE OR REPLACE FUNCTION {{schema}}.acquire(
	p_keys bytea[], p_owner text, p_holder text, p_ttl_ms bigint,
	p_queue boolean, p_waiter_ttl_ms bigint, p_max_fence bigint, p_limit int,
	p_replace boolean, p_preempt boolean,
	OUT o_ok boolean, OUT o_fence bigint, OUT o_busy int, OUT o_busy_holder text,
	OUT o_busy_fence bigint, OUT o_position int, OUT o_waiters int, OUT o_holder_ttl_ms bigint,
	OUT o_busy_holders int, OUT o_replaced int)
LANGUAGE sql AS $$
	SELECT a.o_ok, a.o_fence, a.o_busy, a.o_busy_holder, a.o_busy_fence, a.o_position, a.o_waiters,
	       a.o_holder_ttl_ms, a.o_busy_holders, a.o_replaced
	FROM {{schema}}.acquire(p_keys, p_owner, p_holder, p_ttl_ms, p_queue, p_waiter_ttl_ms, p_max_fence, p_limit,
	                        p_replace, p_preempt, 0) a
$$;

-- dequeue is version 3's (see migration 3) with the queue order of this
-- migration: it notifies a key it leaves when others wait behind it there,
-- by (rank, ticket, owner), and the key has room.
CREATE OR REPLACE FUNCTION {{schema}}.dequeue(p_keys bytea[], p_owner text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
	v_now    timestamptz;
	v_ticket bigint;
	v_rank   bigint;
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
			RETURNING w.rank, w.ticket INTO v_rank, v_ticket;
		IF FOUND THEN
			v_left := v_left + 1;
			DELETE FROM {{schema}}.waiters w WHERE w.key = p_keys[i] AND w.deadline < v_now;
			SELECT * INTO v_row FROM {{schema}}.locks l WHERE l.key = p_keys[i];
			SELECT count(*), min(s.lim) INTO v_count, v_bound
				FROM {{schema}}.slots s WHERE s.key = p_keys[i] AND s.expires > v_now;
			IF NOT (v_row.owner IS NOT NULL AND v_row.expires > v_now)
			   AND (v_count = 0 OR v_count < v_bound)
			   AND EXISTS (SELECT 1 FROM {{schema}}.waiters w
			               WHERE w.key = p_keys[i] AND (w.rank, w.ticket, w.owner) > (v_rank, v_ticket, p_owner)) THEN
				PERFORM pg_notify({{channel}}, encode(p_keys[i], 'hex'));
			END IF;
		END IF;
	END LOOP;
	RETURN v_left;
END
$$;
