package redistest

import "context"

// LockwardenCommands are the command rules of the minimal ACL that
// docs/backends.md ("Redis requirements") gives a lockwarden user: the
// connection commands, the two script commands, the commands the scripts
// call (Redis checks them against the caller's ACL too), the pub/sub
// commands, and CONFIG GET for the settings check. Keep the two in step.
var LockwardenCommands = []string{
	"-@all",
	"+hello", "+auth", "+ping", "+select",
	"+evalsha", "+eval", "+script|load",
	"+time", "+exists", "+get", "+getset", "+mget", "+set", "+del", "+incr", "+persist",
	"+hget", "+hmget", "+hset", "+hdel", "+hvals",
	"+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zscore", "+zcount", "+zcard", "+zrank",
	"+pttl", "+pexpire", "+publish",
	"+subscribe", "+psubscribe", "+unsubscribe", "+punsubscribe",
	"+config|get",
}

// NamespaceACL are the key and channel rules docs/security.md ("Tenants on
// one Redis") gives the user of one namespace's LockBackend, with the
// operator's key prefix lockwarden:. (Redis checks a PSUBSCRIBE pattern
// literally against the channel rules: the rule is the operator's pattern.)
func NamespaceACL(namespace string) []string {
	return []string{"~lockwarden:{ns/" + namespace + "/*", "&lockwarden:{ns/" + namespace + "/*}:released"}
}

// SetUser creates or replaces the ACL user name with password and rules
// (after resetkeys and resetchannels, so that only the rules given apply).
func (s *Server) SetUser(ctx context.Context, name, password string, rules ...string) error {
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password, "resetkeys", "resetchannels"}
	for _, r := range rules {
		args = append(args, r)
	}
	return s.Client().Do(ctx, args...).Err()
}
