"""A read-only handle that follows a cache's name across a destroy and a re-create.

A cache destroyed and created again under the same name is a new file (another
inode, ipc.segment.identity): a long-lived reader (the metrics endpoint, a Spark
executor's Python worker) that kept its old mapping would go on reading a dead
table. `Followed.reader()` looks at what is at the name (one lstat, no symlink
followed) and re-attaches when it changed, or when the file mapped was made writable by its
group or others (chmod): the attach's checks then refuse it (unsafe mode) until its mode is
safe again. It only ever `table.attach()`es (read-only: never written, never unlinked).
"""

from __future__ import annotations

from shmcache.ipc.segment import check_name, look, owner_uid


def follow(name: str, owner: int | str | None = None) -> "Followed":
    """A read-only handle that follows the cache at `name` across a destroy and a re-create
    (shmcache.follow): call `reader()` before each batch for the Reader on what is at the
    name now (None while nothing is), which raises what that file's attach raises (not a
    cache, another owner's, a mode anyone may write) for as long as it is there. A plain
    `attach()` Reader keeps the file it mapped, destroyed or not: a service that must never
    serve a destroyed cache follows its name (docs/reader-contract.md)."""
    owner_uid(owner, check_name(name))  # a bad name or an unknown owner: now, not at the first reader()
    return Followed(name, owner)


class Followed:
    """What shmcache.follow(name) returns: `reader()` gives the Reader of whatever cache is at
    the name now, attached again after a destroy and a re-create; `close()` unmaps it."""

    def __init__(self, name: str, owner: int | str | None = None):
        """Follow the cache at `name` (nothing is attached until the first reader()); `owner`
        as attach's, checked at every attach."""
        self.name = name
        self.owner = owner  # attach(owner=): every re-attach checks whose the new file is
        self._reader = None
        self._id = None  # look() of the segment attached: another file, or a mode others may write now
        self.attached_now = False  # the last reader() call (re)attached

    def _identity(self):
        try:
            return look(self.name)  # what is at the name now (a symlink is not followed), and its mode
        except OSError:
            return None

    def reader(self):
        """The handle on what is at the name now (re-attached if it changed); None if nothing is.

        Errors of the attach itself (a damaged segment, a race with a destroy) propagate."""
        from shmcache.engine import table

        self.attached_now = False
        now = self._identity()  # before attach: a re-create in between is seen next time
        if self._reader is not None and now != self._id:  # destroyed or re-created
            self.close()
        if self._reader is None and now is not None:
            self._reader = table.attach(self.name, owner=self.owner)
            self._id = now
            self.attached_now = True
        return self._reader

    def moved(self) -> bool:
        """What is at the name is no longer the segment held (destroyed or re-created)."""
        return self._reader is not None and self._identity() != self._id

    def close(self) -> None:
        """Unmap the cache held, if any (never destroys it); the next reader() attaches again."""
        if self._reader is not None:
            self._reader.close()  # unmaps; never destroys
        self._reader = self._id = None
