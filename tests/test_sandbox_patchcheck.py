"""validate_patch: every rejection reason reached on purpose, on real git repos made in tmp dirs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.patchcheck import EmptyPatch, PatchError, PatchRejected, validate_patch

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]


def make_repo(root: Path, files: dict[str, bytes | str]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([*GIT, "init", "-q"], cwd=root, check=True)
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=root, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def diff_of(root: Path, change) -> bytes:
    """Make a real `git diff --binary` by changing the tree, then put the tree back."""
    change(root)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    out = subprocess.run([*GIT, "diff", "--cached", "--binary"], cwd=root, check=True, capture_output=True).stdout
    subprocess.run([*GIT, "reset", "-q", "--hard"], cwd=root, check=True)
    subprocess.run([*GIT, "clean", "-qfdx"], cwd=root, check=True)
    return out


SIMPLE = "--- a/{p}\n+++ b/{q}\n@@ -1 +1 @@\n-a\n+b\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    make_repo(tmp_path / "repo", {"src/x.py": "a\n", "README": "hi\n"})
    return tmp_path / "repo"


def rejected(patch: str | bytes, repo: Path, **kw) -> str:
    with pytest.raises(PatchRejected) as exc:
        validate_patch(patch, repo, **kw)
    return str(exc.value)


def test_plain_patch_is_described(repo: Path) -> None:
    patch = diff_of(repo, lambda r: (r / "src/x.py").write_text("b\nc\n"))
    info = validate_patch(patch, repo)
    assert [(f.path, f.change, f.lines_added, f.lines_removed) for f in info.files] == [("src/x.py", "modified", 2, 1)]
    assert info.data == patch and info.size_bytes == len(patch)


def test_added_deleted_renamed(repo: Path) -> None:
    def change(r: Path) -> None:
        (r / "new.py").write_text("x = 1\n")
        (r / "README").unlink()
        (r / "src/x.py").rename(r / "src/y.py")

    info = validate_patch(diff_of(repo, change), repo)
    kinds = {f.path: (f.change, f.old_path) for f in info.files}
    assert kinds == {"new.py": ("added", None), "README": ("deleted", None), "src/y.py": ("renamed", "src/x.py")}
    assert set(info.paths) == {"new.py", "README", "src/x.py", "src/y.py"}


@pytest.mark.parametrize("patch", ["", "   \n\t\n", b"\n"])
def test_empty_patch_is_its_own_outcome(repo: Path, patch) -> None:
    with pytest.raises(EmptyPatch):
        validate_patch(patch, repo)


@pytest.mark.parametrize(
    "patch, needle",
    [
        (SIMPLE.format(p="/etc/passwd", q="/etc/passwd"), "absolute path '/etc/passwd'"),
        ("--- a/src/x.py\n+++ b//etc/evil\n@@ -1 +1 @@\n-a\n+b\n", "'/etc/evil'"),
        (SIMPLE.format(p="src/../../x", q="src/../../x"), "'..'"),
        ("diff --git a/.git/hooks/x b/.git/hooks/x\nnew file mode 100755\n--- /dev/null\n+++ b/.git/hooks/x\n"
         "@@ -0,0 +1 @@\n+rm -rf /\n", ".git directory"),
        (SIMPLE.format(p=".GIT/config", q=".GIT/config"), ".git directory"),
        (SIMPLE.format(p="sub/.Git/HEAD", q="sub/.Git/HEAD"), ".git directory"),
        # git's C quoting hides ".git" as \056git; the name must be unquoted before the check
        ('diff --git "a/\\056git/config" "b/\\056git/config"\n--- "a/\\056git/config"\n+++ "b/\\056git/config"\n'
         "@@ -1 +1 @@\n-a\n+b\n", ".git directory"),
        ("diff --git a/src/x.py b/src/z.py\nsimilarity index 100%\nrename from src/x.py\nrename to ../z.py\n", "'..'"),
        ("diff --git a/src/x.py b/src/z.py\nsimilarity index 100%\ncopy from src/x.py\ncopy to /tmp/z.py\n", "absolute"),
        ("Index: /etc/shadow\n" + SIMPLE.format(p="src/x.py", q="src/x.py"), "absolute"),
        # GNU patch stops a name at whitespace: the second token is what it would use
        ("--- a/src/x.py\n+++ b/ok.py /etc/evil\n@@ -1 +1 @@\n-a\n+b\n", "absolute"),
    ],
    ids=["absolute", "b-double-slash", "dotdot", "git-hooks", "GIT-config", "nested-git", "quoted-git",
         "rename-dotdot", "copy-absolute", "index-line", "gnu-whitespace-name"],
)
def test_path_rejections(repo: Path, patch: str, needle: str) -> None:
    assert needle in rejected(patch, repo)


def test_b_double_slash_message_explains(repo: Path) -> None:
    msg = rejected("--- a/src/x.py\n+++ b//etc/evil\n@@ -1 +1 @@\n-a\n+b\n", repo)
    assert "line 2" in msg and "GNU patch" in msg


def test_symlink_escape_through_existing_dir(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, repo / "data")
    msg = rejected("--- /dev/null\n+++ b/data/evil.py\n@@ -0,0 +1 @@\n+x\n", repo)
    assert "symlink 'data'" in msg and "outside the repository" in msg
    # a symlink staying inside the repo is fine
    os.symlink("src", repo / "alias")
    assert validate_patch("--- /dev/null\n+++ b/alias/new.py\n@@ -0,0 +1 @@\n+x\n", repo).files[0].path == "alias/new.py"


def test_symlink_into_git_dir_rejected(repo: Path) -> None:
    os.symlink(".git/hooks", repo / "hooks")
    assert "into .git" in rejected("--- /dev/null\n+++ b/hooks/pre-commit\n@@ -0,0 +1 @@\n+x\n", repo)


LINK = "diff --git a/{n} b/{n}\nnew file mode 120000\n--- /dev/null\n+++ b/{n}\n@@ -0,0 +1 @@\n+{t}\n\\ No newline at end of file\n"


@pytest.mark.parametrize("target", ["/etc", "../../outside", "src/../../x", ".git/hooks"])
def test_new_symlink_pointing_out_rejected(repo: Path, target: str) -> None:
    msg = rejected(LINK.format(n="lnk", t=target), repo)
    assert "symlink" in msg and "lnk" in msg


def test_symlink_created_then_written_through(repo: Path) -> None:
    patch = LINK.format(n="lnk", t="src") + "diff --git a/lnk/pwn.py b/lnk/pwn.py\nnew file mode 100644\n" \
        "--- /dev/null\n+++ b/lnk/pwn.py\n@@ -0,0 +1 @@\n+x\n"
    assert "also writes under it" in rejected(patch, repo)


def test_inside_symlink_accepted_and_flagged(repo: Path) -> None:
    info = validate_patch(LINK.format(n="src/alias", t="x.py"), repo)
    assert info.files[0].symlink and info.files[0].change == "added"


def test_size_cap(repo: Path) -> None:
    body = "".join(f"+line {i}\n" for i in range(2000))
    patch = f"--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,2000 @@\n{body}"
    assert validate_patch(patch, repo).files[0].lines_added == 2000
    assert "over the" in rejected(patch, repo, max_bytes=10_000)


def test_malformed_hunk_names_the_line(repo: Path) -> None:
    patch = "--- a/src/x.py\n+++ b/src/x.py\n@@ -1,2 +1,2 @@\n-a\nGARBAGE\n+b\n"
    msg = rejected(patch, repo)
    assert msg.startswith("line 5:") and "malformed hunk" in msg
    truncated = "--- a/src/x.py\n+++ b/src/x.py\n@@ -1,3 +1,3 @@\n-a\n+b\n"
    assert "truncated" in rejected(truncated, repo)
    assert "malformed hunk header" in rejected("--- a/src/x.py\n+++ b/src/x.py\n@@ -x +1 @@\n-a\n+b\n", repo)


def test_not_a_diff(repo: Path) -> None:
    assert "no file changes found" in rejected("I fixed the bug, trust me.\n", repo)


def test_nul_outside_binary_section(repo: Path) -> None:
    msg = rejected(b"--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\x00\n", repo)
    assert msg.startswith("line 5:") and "NUL" in msg


def test_binary_patch_accepted(repo: Path) -> None:
    payload = bytes(range(256)) * 4
    patch = diff_of(repo, lambda r: (r / "blob.bin").write_bytes(payload))
    assert b"GIT binary patch" in patch
    info = validate_patch(patch, repo)
    assert info.files[0].binary and info.files[0].path == "blob.bin" and info.has_binary


def test_non_utf8_patch_accepted(repo: Path) -> None:
    (repo / "latin.txt").write_bytes(b"caf\xe9\n")
    patch = diff_of(repo, lambda r: (r / "latin.txt").write_bytes(b"caf\xe9 cr\xe8me\n"))
    with pytest.raises(UnicodeDecodeError):
        patch.decode("utf-8")
    info = validate_patch(patch, repo)
    assert info.data == patch and info.files[0].lines_added == 1


def test_hunk_body_lines_are_not_headers(repo: Path) -> None:
    # Removing a line "-- /etc/x" / adding "++ /abs" must not be read as file headers.
    patch = "--- a/src/x.py\n+++ b/src/x.py\n@@ -1,2 +1,2 @@\n--- /etc/x\n+++ /abs\n a\n"
    assert [f.path for f in validate_patch(patch, repo).files] == ["src/x.py"]


def test_unpaired_surrogate_text_is_rejected_not_crashing(repo: Path) -> None:
    assert "unpaired surrogate" in rejected("--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+\ud800\n", repo)


_PIECES = ["--- a/src/x.py\n", "+++ b/src/x.py\n", "@@ -1 +1 @@\n", "@@ -1,2 +0,0 @@\n", "-a\n", "+b\n", " c\n",
           "diff --git a/x b/x\n", "new file mode 120000\n", "GIT binary patch\n", "literal 3\n", "\\ No newline\n",
           "rename from x\n", "rename to y\n", "\n", "+++ /dev/null\n", "--- /dev/null\n", "junk\n", "\x00", "\xff"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_PIECES), max_size=12), st.binary(max_size=40))
def test_fuzz_only_patch_errors(repo: Path, pieces: list[str], noise: bytes) -> None:
    """Whatever the bytes, validation either describes the patch or refuses it; it never crashes."""
    data = "".join(pieces).encode("utf-8", "surrogateescape") + noise
    try:
        info = validate_patch(data, repo)
    except PatchError:
        return
    assert info.files and all(not f.path.startswith("/") and ".." not in f.path.split("/") for f in info.files)
