-- Migration 2: renewal and release scoped to the acquisition, not the owner.
--
-- An owner that acquires keys it already holds (a restarted operator: the
-- same owner token) gets a new fencing token. Migration 1's renew and release
-- matched the owner only, so the first lease, still in an old process's
-- hands, could extend or free the second one: another owner could then take
-- the keys while the second lease was valid. Both now also match the lease's
-- fencing token (every key of a lease has the lease's fence, acquire), and a
-- key held by the owner with another token counts as lost for a renewal.
-- The new functions take the token as a new argument, so they are new
-- overloads: migration 1's renew and release stay, for the operator this
-- version replaces, which checked the schema version once, when it started,
-- and keeps calling them until its pod is gone (during a rolling upgrade,
-- its leases stay renewable). A later migration drops them.

-- renew extends many leases at once: lease p_lease[i] owns key p_keys[i], and
-- p_owners[n] and p_fences[n] are lease n's owner token and fencing token. A
-- lease is renewed when its owner holds every one of its keys with a live
-- lease of that token; otherwise it is lost, and the keys it still held (with
-- that token) are released (and notified) instead. Returns one row per lease:
-- 0 when renewed, else the 1-based position (within the lease's keys) of the
-- first key it no longer held.
CREATE FUNCTION {{schema}}.renew(p_lease int[], p_keys bytea[], p_owners text[], p_fences bigint[], p_ttl_ms bigint)
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
			       min(u.pos) FILTER (WHERE l.key IS NULL OR l.owner IS DISTINCT FROM p_owners[u.lease]
			                          OR l.fence <> p_fences[u.lease] OR l.expires <= v_now) AS lost
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
			WHERE l.key = x.key AND x.lease = ANY (v_bad) AND l.owner = p_owners[x.lease]
			  AND l.fence = p_fences[x.lease] AND l.expires > v_now
			RETURNING l.key
	LOOP
		PERFORM pg_notify({{channel}}, encode(v_key, 'hex'));
	END LOOP;
	RETURN QUERY SELECT a.l, a.p FROM unnest(v_leases, v_lost) AS a(l, p);
END
$$;

-- release frees the keys p_owner holds with a live lease of fencing token
-- p_fence and notifies each one. Returns how many it freed.
CREATE FUNCTION {{schema}}.release(p_keys bytea[], p_owner text, p_fence bigint) RETURNS int
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
	RETURN v_n;
END
$$;
