package shmcache

// Whose the cache's file is, and who may write it (docs/segment-format.md, section 4):
// checked on fstat of the opened file before any byte of it is read, at attach and at
// every re-attach of a followed name. Anyone may create a name in /dev/shm before the
// cache's supervisor does, and serve any values from it.

import (
	"os/user"
	"strconv"
)

// LargestUID is the largest uid WithOwner may name: 2^32 - 2 ((uid_t) -1 is no user's;
// golden/contract.json).
const LargestUID = 1<<32 - 2

// unsafeModeBits are the mode bits that let a file's group or others write it.
const unsafeModeBits = 0o022

// Option is an option of Attach and AttachPath.
type Option func(*options)

type options struct {
	owner string // WithOwner's user
	named bool   // WithOwner was given
}

// WithOwner says whose the cache must be: a user name this machine knows, else a uid in
// digits. A file another user owns is refused (ErrWrongOwner), at attach and at every
// re-attach of a followed name, and a readers' companion another user owns is not used.
// An unknown user is ErrBadArgument.
func WithOwner(user string) Option { return func(o *options) { o.owner, o.named = user, true } }

// ownerUID resolves WithOwner's user as the Python reader does: a name this machine knows,
// else digits as a uid. -1: no owner named.
func (o options) ownerUID(cache string) (int64, error) {
	if !o.named {
		return -1, nil
	}
	if o.owner != "" {
		if u, err := user.Lookup(o.owner); err == nil {
			if uid, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
				return int64(uid), nil
			}
		}
		if uid, err := strconv.ParseUint(o.owner, 10, 32); err == nil && isDigits(o.owner) && len(o.owner) <= 10 &&
			uid <= LargestUID {
			return int64(uid), nil
		}
	}
	return -1, newErr(cache, ErrBadArgument, "owner %q: no such user on this machine (a user name, or a uid from 0 "+
		"to %d)", o.owner, uint64(LargestUID))
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// userText is "uid 998 (shmcache)", or "uid 4242" for a uid with no name on this machine.
func userText(uid int64) string {
	if u, err := user.LookupId(strconv.FormatInt(uid, 10)); err == nil {
		return "uid " + strconv.FormatInt(uid, 10) + " (" + u.Username + ")"
	}
	return "uid " + strconv.FormatInt(uid, 10)
}

// checkOwner refuses a file another user than owner (-1: any) owns.
func checkOwner(cache, path string, f fileInfo, owner int64) error {
	if owner >= 0 && int64(f.uid) != owner {
		return newErr(cache, ErrWrongOwner, "%s belongs to %s, not to %s as its reader was told (owner): refusing "+
			"to read it (any user may create a name in /dev/shm before its supervisor does)", path,
			userText(int64(f.uid)), userText(owner))
	}
	return nil
}

// checkMode refuses a cache's file its group or others may write: no shmcache creator
// makes one, so it was widened by hand or planted, and its content is anyone's.
func checkMode(cache, path string, f fileInfo) error {
	if f.mode&unsafeModeBits != 0 {
		return newErr(cache, ErrUnsafeMode, "%s has mode %04o (owner %s): its group or others may write it, so "+
			"anyone could have put its content there; no shmcache creator makes such a file: refusing to read it "+
			"(destroy and re-create the cache, or chmod it back to 0600 or 0640)", path, f.mode&0o777,
			userText(int64(f.uid)))
	}
	return nil
}
