"""A git worktree for a session's work on a repository: `rlm(task, worktree=PATH)` or a goal's `worktree:`
(docs/kernel-api.md, "Worktrees").

The worktree is `sessions/<id>/work/worktree/`, in the session's room (its sandbox writes there), on a new
branch `primefs/<id>` of the repository, made by the runner at the session's first turn. At each turn end
the runner commits what the kernel changed there on that branch and lists the files changed since the
branch began; a worktree that changed nothing is removed (and made again, from the repository's HEAD, at
the next turn). Nothing is ever merged: the parent gets the branch, the files and the files a sibling's
branch changed too.

The folder is the kernel's to write, so the runner never lets git read it by path or trust its `.git`
file: it reads the folder through folder descriptors (gitops.blob_entries) and names the repository's own
worktree folder (`<repo>/.git/worktrees/<name>`) to git. Repositories in a session's folder, which kernels
write, are refused: their config could name commands git would run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.gitops import blob_entries, git, removal

FOLDER = "worktree"  # sessions/<id>/work/worktree


def check_repo(ws, path, where: str) -> str:
    """The top folder of the repository at `path` (workspace-relative or absolute), as an absolute path;
    PrimefsError naming `where` if it is not one a session may work on."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise PrimefsError(f"{where}: a worktree is named by the path of a git repository")

    def written_by_kernels(folder: Path) -> None:  # checked before git reads anything of it
        if folder.is_relative_to(ws.sessions.resolve()):
            raise PrimefsError(f"{where}: {path!r} lies in a session's folder, which kernels write: a worktree is "
                               "made of a repository a person made")

    p = (ws.root / path).resolve()
    written_by_kernels(p)
    if not p.is_dir():
        raise PrimefsError(f"{where}: {path!r} is not a folder ({p})")
    found = git(p, "rev-parse", "--show-toplevel", check=False)
    if found.returncode or not found.stdout.strip():
        raise PrimefsError(f"{where}: {path!r} is not a git repository ({p})")
    top = Path(found.stdout.strip()).resolve()
    written_by_kernels(top)
    if git(top, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False).returncode:
        raise PrimefsError(f"{where}: {path!r} has no commit yet: a worktree starts from one")
    return str(top)


def note(meta: dict) -> str | None:
    """What the session's model is told of its worktree (its system prompt), if it has one."""
    wt = meta.get("worktree")
    if not wt:
        return None
    repo = wt["repo"] if isinstance(wt, dict) else wt
    return (f"Your own git worktree of the repository {repo} is the folder ./{FOLDER} (branch primefs/"
            f"{meta.get('id', '<id>')}): do the work there. At the end of each turn what you changed there is "
            "committed on that branch; your parent gets the branch and the files changed.")


def ensure(ws, session) -> dict:
    """Make the session's worktree if it has none yet, or none since it was removed; its record."""
    wt = session.meta.get("worktree")
    if isinstance(wt, dict) and not wt.get("removed"):
        return wt
    repo = Path(wt["repo"] if isinstance(wt, dict) else wt)
    branch, path = f"primefs/{session.id}", session.dir / "work" / FOLDER
    path.parent.mkdir(exist_ok=True)
    # The room is the kernel's: a link it put at `path` would have git write the checkout through it, as the
    # runner (into another session's mail, anywhere). So the worktree is made in the session's own folder,
    # which no kernel can write, and moved into the room: a rename replaces no link and follows none.
    made = Path(tempfile.mkdtemp(prefix=".worktree-", suffix=".tmp", dir=session.dir))  # (ignored by git)
    os.rmdir(made)  # (git makes it: a name no one else can take, in a folder no kernel writes)
    try:
        if path.is_symlink():
            path.unlink()
        git(repo, "worktree", "prune")
        base = git(repo, "rev-parse", "HEAD").stdout.strip()
        has_branch = not git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False).returncode
        git(repo, "worktree", "add", *(() if has_branch else ("-b", branch)), str(made),
            branch if has_branch else base)
        git(repo, "worktree", "move", str(made), str(path))
    except (subprocess.CalledProcessError, OSError) as exc:  # the repository moved, or git refused
        if made.is_dir():
            shutil.rmtree(made, ignore_errors=True)
            git(repo, "worktree", "prune", check=False)
        raise PrimefsError(f"worktree of {repo}: {(getattr(exc, 'stderr', '') or str(exc)).strip()[:500]}") from None
    info = {"repo": str(repo), "branch": branch, "base": base, "path": str(path), "gitdir": _admin_dir(repo, path),
            "changed": [], "overlaps": {}}
    session.update(worktree=info)
    return info


def _admin_dir(repo: Path, path: Path) -> str:
    """The repository's own folder for the worktree at `path` (.git/worktrees/<name>): found from the
    repository's side, never from the `.git` file in the worktree (the kernel's to change)."""
    common = Path(repo) / git(repo, "rev-parse", "--git-common-dir").stdout.strip()
    for admin in sorted((common / "worktrees").iterdir()):
        try:
            if Path((admin / "gitdir").read_text().strip()) == path / ".git":
                return str(admin.resolve())
        except OSError:
            continue
    raise PrimefsError(f"git made no worktree folder for {path} in {repo}")


def settle(session, turn: int | None, siblings: list) -> dict | None:
    """At a turn end: what the kernel changed in the worktree, committed on its branch; the files changed
    since the branch began, and those a sibling's branch (of the same repository) changed too. A worktree
    that changed nothing is removed. The record (also in session.yaml), or None without a worktree."""
    wt = session.meta.get("worktree")
    if not isinstance(wt, dict) or wt.get("removed"):
        return None
    repo, path, gitdir = Path(wt["repo"]), Path(wt["path"]), wt["gitdir"]
    _commit(repo, path, gitdir, f"session {session.id} ({session.name}): turn {turn}\n\nPrimefs-Session: "
                                f"{session.id}\n")
    diff = git(repo, "diff", "--name-only", "-z", wt["base"], f"refs/heads/{wt['branch']}")
    changed = sorted(p for p in diff.stdout.split("\0") if p)
    overlaps = {}
    for other in siblings:
        theirs = other.reload().get("worktree") if other.id != session.id else None
        if other.id != session.id and isinstance(theirs, dict) and theirs.get("repo") == wt["repo"]:
            both = sorted(set(changed) & set(theirs.get("changed") or []))
            if both:
                overlaps[other.id] = both
    info = {**wt, "changed": changed, "overlaps": overlaps}
    if not changed and not _ahead(repo, wt):
        _remove(repo, path, wt["branch"])
        info["removed"] = True
    session.update(worktree=info)
    return info


def _ahead(repo: Path, wt: dict) -> bool:
    """Commits on the branch since it began (a change made and undone still leaves them)."""
    out = git(repo, "rev-list", "--count", f"{wt['base']}..refs/heads/{wt['branch']}", check=False).stdout
    return out.strip() not in ("", "0")


def _commit(repo: Path, path: Path, gitdir: str, message: str) -> None:
    """The worktree's files as they are, committed on its branch (if anything changed)."""
    common = Path(repo) / git(repo, "rev-parse", "--git-common-dir").stdout.strip()
    found = blob_entries(common / "objects", path, "", skip=(".git",))
    with tempfile.TemporaryDirectory(prefix="primefs-worktree-") as tmp:
        env = {"GIT_DIR": gitdir, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        run = lambda *args, **kw: git(Path(tmp), *args, env=env, **kw)  # noqa: E731 - cwd: nothing of the room
        run("read-tree", "HEAD")
        tracked = {p for p in run("ls-files", "-z").stdout.split("\0") if p}
        if found:  # untracked files .gitignore leaves out stay out, as `git add` would
            ignored = git(path, "--git-dir", gitdir, "--work-tree", str(path), "check-ignore", "-z", "--stdin",
                          "--no-index", input="".join(p + "\0" for p in found if p not in tracked),
                          check=False).stdout.split("\0")
            for p in ignored:
                found.pop(p, None)
        lines = [f"{entry}\t{p}" for p, entry in found.items()]
        lines += [removal(p) for p in tracked if p not in found]
        if lines:
            run("update-index", "-z", "--index-info", input="".join(line + "\0" for line in lines))
        tree, head = run("write-tree").stdout.strip(), run("rev-parse", "HEAD").stdout.strip()
        if tree != run("rev-parse", "HEAD^{tree}").stdout.strip():
            commit = run("commit-tree", tree, "-p", head, input=message).stdout.strip()
            run("update-ref", "HEAD", commit, head)
    git(Path(gitdir), "read-tree", "HEAD", env={"GIT_DIR": gitdir})  # the worktree's index: its new HEAD


def _remove(repo: Path, path: Path, branch: str) -> None:
    """An unchanged worktree goes: its folder (never through a link), git's record of it, its branch."""
    try:
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path)  # fd-based: a link swapped in is removed, not followed
    except FileNotFoundError:
        pass
    git(repo, "worktree", "prune")
    git(repo, "branch", "-D", branch, check=False)


def shown(meta: dict) -> dict | None:
    """The session's worktree as its parent's kernel sees it (Handle.worktree)."""
    wt = meta.get("worktree")
    keys = ("repo", "branch", "path", "changed", "overlaps", "removed")
    return {k: wt.get(k) for k in keys} if isinstance(wt, dict) else None


def summary(wt) -> str:
    """One line for the parent's result mail."""
    if not isinstance(wt, dict):
        return ""
    if wt.get("removed"):
        return f"[worktree of {wt['repo']}: nothing changed; removed]"
    files = ", ".join(wt["changed"][:50]) + (f" (+{len(wt['changed']) - 50} more)" if len(wt["changed"]) > 50 else "")
    clash = "".join(f"; also changed by sibling {sid}: {', '.join(ps[:20])}" for sid, ps in wt["overlaps"].items())
    return f"[worktree of {wt['repo']}: branch {wt['branch']}; changed: {files}{clash}]"


