"""MkDocs hook (mkdocs.yml `hooks:`): the API reference's source.

The repo's root is the `shmcache` package itself (pyproject.toml's package-dir), so no
folder is named `shmcache` for mkdocstrings' loader (griffe) to find. At start the hook
makes build/docs-src/shmcache, a symbolic link to the root, which mkdocs.yml names as
the handler's `paths`; build/ is ignored by git."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = ROOT / "build" / "docs-src" / "shmcache"


def on_startup(command, dirty) -> None:  # noqa: ARG001 - MkDocs' hook signature
    LINK.parent.mkdir(parents=True, exist_ok=True)
    if not LINK.is_symlink():
        LINK.symlink_to(ROOT, target_is_directory=True)
