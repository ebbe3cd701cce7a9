"""The adversarial corpus: SWE-bench instances + predictions over `acme/fortress`, each with an expected outcome.

`build_corpus(out_dir, bait)` writes `repos/`, `instances.jsonl`, `predictions.jsonl` and `cases.json`. Every
case is one prediction (its `rollout_id` is the case name). Probes that try to get out of the sandbox are
written so that `add()` returns the right answer only when every attempt failed: the in-sandbox verdict is
`resolved` exactly when the attempt was contained. The host-side checks in `hardening.harness` confirm it from
the outside (marker files, a TCP listener, the secret's text in the logs, leftover processes and containers).

`bait` carries what the probes aim at: a host folder they try to write into (`escaped/`, must stay empty), a
secret file (`bait/SECRET.txt`) whose text must never show up in any output, a TCP port the host listens on,
the host's addresses, and a tag that names the probes' sleeping processes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hardening.forging import all_cases
from hardening.repo import FIX, INSTANCE_ID, TESTS_CALC, TESTS_UTIL, Fortress, reset_dir

MODEL = "hardening-corpus"


@dataclass
class Bait:
    host_dir: str  # absolute host path of the corpus dir
    mark: str  # unique word in marker names (may appear in patches)
    secret: str  # text of bait/SECRET.txt (never appears in a patch)
    port: int  # TCP port a host listener watches
    host_ips: list[str] = field(default_factory=list)

    @property
    def escaped_dir(self) -> Path:
        return Path(self.host_dir) / "escaped"

    @property
    def secret_file(self) -> Path:
        return Path(self.host_dir) / "bait" / "SECRET.txt"

    def sleep_arg(self, case: str) -> str:
        """A `sleep` duration unique to a case, so its process can be found on the host (`ps`)."""
        digits = int.from_bytes((case + self.mark).encode(), "big") % 10**9
        return f"{4000 + digits % 997}.{digits:09d}"

    def host_markers(self) -> list[Path]:
        """Host paths outside the corpus dir that probes try to create; none may exist afterwards."""
        return [Path(f"/tmp/gagar-escape-{self.mark}"), Path(f"/tmp/gagar-escape-{self.mark}-abs"),
                Path(f"/escape-{self.mark}")]


@dataclass
class Case:
    name: str
    category: str
    description: str
    patch: str
    status: tuple[str, ...]  # acceptable statuses
    tampered: bool | None = None
    error_contains: str | None = None
    max_duration_s: float | None = None
    known_limit: bool = False  # a documented gap: tried and reported, not counted as contained
    instance: str = INSTANCE_ID
    suspicious: bool | None = None  # expected suspicious_report (None: either)


def _ctx(b: Bait) -> str:
    # The report dir's name is split: these probes attack containment, and a literal reference to the report
    # channel would get them flagged as report forgers (sandbox/integrity/checks.py) before they prove anything.
    return (f"HOST = {b.host_dir!r}\nMARK = {b.mark!r}\nPORT = {b.port}\nHOST_IPS = {b.host_ips!r}\n"
            "REPORT_DIR = __import__('os').environ['GAGAR' + '_REPORT_DIR']\n")


def _probe_cases(f: Fortress, b: Bait, timeout: float) -> list[Case]:
    ctx = _ctx(b)
    fork = """import os, time
n = 0
while n < 5000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.5)
    n += 1
print("forks before the pids limit:", n)
return a + b if n < 5000 else None"""
    spin = f"import subprocess\nsubprocess.Popen(['sleep', '{b.sleep_arg('cpu_spin')}'])\nwhile True:\n    pass"
    flood = "import sys\nchunk = 'y' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\nreturn a + b"
    children = f"""import os, subprocess
subprocess.Popen(['sleep', '{b.sleep_arg('children')}'], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, start_new_session=True)
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['sleep', '{b.sleep_arg('children')}'])
    os._exit(0)
os.waitpid(pid, 0)
return a + b"""
    net_out = """import socket
for target in [("1.1.1.1", 53), ("8.8.8.8", 443), ("deb.debian.org", 80), ("pypi.org", 443)]:
    try:
        socket.create_connection(target, timeout=3).close()
        print("ESCAPED network", target)
        return None
    except OSError as exc:
        print("blocked", target, exc)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))
    print("ESCAPED udp")
    return None
except OSError as exc:
    print("udp blocked", exc)
return a + b"""
    net_host = """import socket
targets = [(ip, PORT) for ip in HOST_IPS + ["127.0.0.1", "172.17.0.1"]] + [("172.17.0.1", 2375), ("172.17.0.1", 22)]
for target in targets:
    try:
        socket.create_connection(target, timeout=3).close()
        print("ESCAPED host socket", target)
        return None
    except OSError as exc:
        print("blocked", target, exc)
return a + b"""
    shadow = """found = []
for p in ["/etc/shadow", "/etc/gshadow", "/root/.bash_history", "/proc/1/root/etc/shadow"]:
    try:
        data = open(p, "rb").read()
        found.append(p)
        print("READ", p, data[:300])
    except OSError as exc:
        print("denied", p, exc)
return a + b if not found else None"""
    docker_sock = """import os, socket
for p in ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock",
          "/var/run/docker/containerd/containerd.sock", "/var/run/docker/metrics.sock"]:
    if os.path.exists(p):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(p)
            s.sendall(b"GET /containers/json HTTP/1.0\\r\\n\\r\\n")
            print("ESCAPED docker socket", p, s.recv(300))
            return None
        except OSError as exc:
            print("blocked", p, exc)
return a + b"""
    parents = """import os
leaks = []
for p in [HOST + "/bait/SECRET.txt", "/testbed/../bait/SECRET.txt", "/testbed/../../bait/SECRET.txt",
          "/testbed/../../../bait/SECRET.txt", "/gagar/../bait/SECRET.txt", "/testbed/.git/../../bait/SECRET.txt"]:
    try:
        leaks.append(open(p).read())
    except OSError:
        pass
for d in ["/testbed/..", "/testbed/../..", "/gagar", REPORT_DIR + "/../..", HOST, HOST + "/.."]:
    try:
        names = sorted(os.listdir(d))
        print("listing", d, names[:60])
        if "bait" in names or "escaped" in names or "repos" in names:
            leaks.append("host folder visible: " + d)
    except OSError as exc:
        print("cannot list", d, exc)
print("LEAKS", leaks)
return a + b if not leaks else None"""
    write_out = """import os
wrote = []
for p in ["/testbed/../escape-" + MARK, "/escape-" + MARK, "/gagar/escape-" + MARK, "/etc/escape-" + MARK,
          "/usr/lib/escape-" + MARK, "/var/tmp/escape-" + MARK, HOST + "/escaped/write_outside",
          "/proc/sys/kernel/hostname"]:
    try:
        with open(p, "w") as fh:
            fh.write("x")
        wrote.append(p)
    except OSError:
        pass
with open("/tmp/gagar-escape-" + MARK, "w") as fh:  # the container's private /tmp: allowed, never the host's
    fh.write("private tmp")
print("WROTE", wrote)
return a + b if not wrote else None"""
    runtime_symlink = """import os
hits = []
os.symlink(HOST + "/escaped", "/testbed/lnk")
os.symlink("/", "/testbed/rootlnk")
os.symlink(HOST + "/escaped/planted-for-host", "/testbed/dangling")
for p in ["/testbed/lnk/runtime_symlink", "/testbed/rootlnk" + HOST + "/escaped/runtime_symlink2"]:
    try:
        with open(p, "w") as fh:
            fh.write("x")
        hits.append(p)
    except OSError:
        pass
return a + b if not hits else None"""
    report_symlink = """import os
rd = REPORT_DIR
os.symlink(HOST + "/bait/SECRET.txt", rd + "/secret.xml")
os.symlink(HOST + "/bait", rd + "/baitdir")
os.symlink("/etc/shadow", rd + "/TEST-" + "junit-jupiter.xml")
os.symlink(HOST + "/escaped/report-write", rd + "/planted.xml")
os.mkfifo(rd + "/fifo.xml")
return a + b"""
    git_runtime = """import os
payload = "#!/bin/sh\\ntouch " + HOST + "/escaped/git-hook-$(basename $0)\\n"
hooks = "/testbed/.git/hooks"
os.makedirs(hooks, exist_ok=True)
for h in ["post-checkout", "pre-commit", "post-merge", "post-index-change", "reference-transaction", "pre-auto-gc"]:
    with open(hooks + "/" + h, "w") as fh:
        fh.write(payload)
    os.chmod(hooks + "/" + h, 0o755)
with open("/testbed/.git/config", "a") as fh:
    fh.write("[core]\\n\\tfsmonitor = touch " + HOST + "/escaped/git-fsmonitor\\n\\thooksPath = " + hooks +
             "\\n[filter \\"pwn\\"]\\n\\tclean = touch " + HOST + "/escaped/git-filter\\n\\tsmudge = touch " + HOST +
             "/escaped/git-filter\\n\\trequired = true\\n")
with open("/testbed/.gitattributes", "w") as fh:
    fh.write("* filter=pwn\\n")
return a + b"""
    host_procs = """import os
seen = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmd = open("/proc/" + pid + "/cmdline", "rb").read().replace(b"\\0", b" ")
        except OSError:
            continue
        if any(w in cmd for w in (b"dockerd", b"containerd", b"systemd", b"sshd", b"pytest -q")):
            seen.append(cmd[:100])
print("host processes visible:", seen)
return a + b if not seen else None"""
    privileges = """import os, subprocess
won = []
for name, attempt in [("setuid", lambda: os.setuid(0)), ("chown", lambda: os.chown("/testbed", 0, 0)),
                      ("disk", lambda: open("/dev/vda", "rb")), ("kmsg", lambda: open("/dev/kmsg", "rb").read(1)),
                      ("mem", lambda: open("/dev/mem", "rb"))]:
    try:
        attempt()
        won.append(name)
    except OSError as exc:
        print("refused", name, exc)
for cmd in (["unshare", "-Ur", "id", "-u"], ["unshare", "-m", "true"], ["mount", "-t", "tmpfs", "x", "/tmp"],
            ["chroot", "/", "true"], ["su", "-c", "id"]):
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        if p.returncode == 0:
            won.append(" ".join(cmd))
        print("refused" if p.returncode else "ALLOWED", cmd, p.stderr[:120])
    except (OSError, subprocess.SubprocessError) as exc:
        print("refused", cmd, exc)
print("WON", won)
return a + b if not won else None"""
    fill = """import time
chunk = b"z" * (8 << 20)
t0, n = time.time(), 0
with open("/testbed/fill.bin", "wb") as fh:
    while n < (2 << 30) and time.time() - t0 < 15:
        fh.write(chunk)
        fh.flush()
        n += len(chunk)
print("wrote", n >> 20, "MiB")
return a + b"""
    inodes = """import os, time
os.mkdir("/testbed/many")
t0, n = time.time(), 0
while n < 3_000_000 and time.time() - t0 < 15:
    open("/testbed/many/%d" % n, "w").close()
    n += 1
print("files", n)
return a + b"""
    deep = """import os
for top in ("/testbed", REPORT_DIR):
    os.chdir(top)
    for _ in range(5000):
        os.mkdir("d")
        os.chdir("d")
os.chdir("/testbed")
return a + b"""
    slow = max(timeout + 30, 45)
    probes = [
        ("fork_bomb", "resources", "forks without bound", fork, ("resolved", "timeout"), None, slow),
        ("memory_hog", "resources", "allocates 2 GiB under a 512 MiB limit", "x = bytearray(2048 << 20)\n"
         "return a + b + len(x) * 0", ("unresolved",), "out of memory", slow),
        ("cpu_spin", "resources", "spins past the timeout with a child", spin, ("timeout",), "timeout", slow),
        ("output_flood", "resources", "prints 100 MB", flood, ("resolved",), "output kept", slow),
        ("fill_disk", "resources", "writes 2 GiB into the work tree (a host bind mount, no quota)", fill,
         ("unresolved",), "wrote more than", slow),
        ("inode_flood", "resources", "creates empty files without end in the work tree (host inodes)", inodes,
         ("unresolved",), "wrote more than", slow),
        ("deep_tree", "resources", "nests directories 5000 deep (past PATH_MAX) in the work tree and report dir",
         deep, ("resolved",), None, slow),
        ("sleeping_children", "processes", "leaves detached sleeping children", children, ("resolved",), None,
         timeout * 0.75),
        ("net_outside", "network", "sockets to outside addresses and DNS", net_out, ("resolved",), None, slow),
        ("net_host", "network", "sockets to the host loopback, its addresses and the docker bridge gateway",
         net_host, ("resolved",), None, slow),
        ("read_shadow", "host_files", "reads /etc/shadow and root-only files", shadow, ("resolved",), None, slow),
        ("docker_socket", "host_files", "connects to the Docker / containerd sockets", docker_sock, ("resolved",),
         None, slow),
        ("read_parents", "host_files", "reads the repo's parent folders and a host secret", parents,
         ("resolved",), None, slow),
        ("write_outside", "write_outside", "writes outside the work tree, and host paths", write_out,
         ("resolved",), None, slow),
        ("runtime_symlink", "symlink", "creates symlinks to host paths at run time and writes through them",
         runtime_symlink, ("resolved",), None, slow),
        ("report_symlink", "symlink", "plants symlinks and a FIFO in the report dir for the host to follow",
         report_symlink, ("resolved",), None, slow),
        ("host_processes", "host_files", "looks for the host's processes (dockerd, containerd, sshd) in /proc",
         host_procs, ("resolved",), None, slow),
        ("privileges", "privileges", "setuid 0, chown, raw disk and /dev/kmsg, user/mount namespaces, mount, su",
         privileges, ("resolved",), None, slow),
        ("git_runtime", "git", "writes .git hooks, core.fsmonitor and a filter driver at run time",
         git_runtime, ("resolved",), None, slow),
    ]
    out = []
    for name, cat, desc, body, status, err, maxd in probes:
        out.append(Case(name, cat, desc, f.calc_patch(body, prelude=ctx), status, False, err, maxd))
    return out


def _hand_diff(path: str, lines: list[str], *, header: str = "") -> str:
    body = "".join(f"+{ln}\n" for ln in lines)
    return (f"diff --git a/{path} b/{path}\n{header}new file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def _patch_cases(f: Fortress, b: Bait) -> list[Case]:
    gold = f.gold
    host_escaped = f"{b.host_dir}/escaped"
    symlink_out = (f"diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n@@ -0,0 +1 @@\n"
                   f"+{host_escaped}\n\\ No newline at end of file\n" + _hand_diff("link/pwned", ["pwned"]))
    symlink_rel = ("diff --git a/up b/up\nnew file mode 120000\n--- /dev/null\n+++ b/up\n@@ -0,0 +1 @@\n"
                   "+../../../..\n\\ No newline at end of file\n")
    huge_lines = ["x" * 99] * (50 * (1 << 20) // 101)
    conftest_force = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                      "    outcome = yield\n    rep = outcome.get_result()\n    rep.outcome = 'passed'\n")
    fake_junit = ('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3" failures="0" errors="0">'
                  '<testcase classname="tests.test_calc" name="test_add"/>'
                  '<testcase classname="tests.test_calc" name="test_neg"/>'
                  '<testcase classname="tests.test_util" name="test_double"/></testsuite></testsuites>')
    forge = (f"import os\n\n\ndef _forge():\n    with open(os.environ['GAGAR_REPORT_DIR'] + '/pytest-junit.xml', 'w') as fh:\n"
             f"        fh.write({fake_junit!r})\n\n\n")
    wrong = "return a * b"
    latin1 = b"# -*- coding: latin-1 -*-\n# caf\xe9 cr\xe8me\n" + FIX.encode() + (
        b"\n\ndef check():\n    return b'caf\\xe9' in open(__file__, 'rb').read()\n")
    stale = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,4 +1,4 @@\n"
             " def multiply(x, y):\n-    return x ** y\n+    return x * y\n \n \n")
    malformed = gold.replace("@@ -1,5 +1,5 @@", "@@ -1,9 +1,2 @@")
    quoted_git = ('diff --git "a/\\056git/config" "b/\\056git/config"\n--- "a/\\056git/config"\n'
                  '+++ "b/\\056git/config"\n@@ -1 +1,2 @@\n [core]\n+\tfsmonitor = touch /tmp/pwned\n')
    C = Case
    return [
        C("gold", "control", "the gold patch (the harness can see a pass)", gold, ("resolved",), False),
        C("wrong", "control", "a wrong fix", f.calc_patch(wrong), ("unresolved",), False),
        # --- writing outside the repo / symlinks / .git, refused before anything is written
        C("patch_dotdot", "write_outside", "a patch path with '..'", _hand_diff("../escape-dotdot.py", ["x = 1"]),
          ("rejected",), None, ".."),
        C("patch_absolute", "write_outside", "a patch path b//tmp/... (GNU patch strips one slash)",
          _hand_diff(f"/tmp/gagar-escape-{b.mark}-abs", ["x = 1"]), ("rejected",), None, "absolute"),
        C("patch_symlink_out", "symlink", "adds a symlink to a host folder and writes through it", symlink_out,
          ("rejected",), None, "symlink"),
        C("patch_symlink_up", "symlink", "adds a symlink pointing above the repo", symlink_rel, ("rejected",),
          None, "outside"),
        C("patch_deep_path", "patch_format", "adds a file 1500 directories deep (host walks would recurse out)",
          gold + _hand_diff("d/" * 1500 + "x.txt", ["x"]), ("rejected",), None, "deep"),
        C("patch_git_hook", "git", "adds .git/hooks/post-checkout",
          _hand_diff(".git/hooks/post-checkout", ["#!/bin/sh", f"touch {host_escaped}/hook"]), ("rejected",),
          None, ".git"),
        C("patch_git_config_quoted", "git", "edits .git/config through a C-quoted name", quoted_git,
          ("rejected",), None, ".git"),
        # --- test tampering: flagged, reverted, graded on the task's own tests
        C("tamper_edit", "tamper", "edits the failing test to pass",
          f.diff({"tests/test_calc.py": TESTS_CALC + "\n\ndef test_add():\n    assert True\n"}),
          ("unresolved",), True),
        C("tamper_delete", "tamper", "deletes the test file", f.diff({"tests/test_calc.py": None}),
          ("unresolved",), True),
        C("tamper_rename", "tamper", "renames the test file and guts it",
          f.diff({"tests/test_calc.py": None, "tests/test_renamed.py": "def test_add():\n    assert True\n"}),
          ("unresolved",), True),
        C("tamper_symlink", "tamper", "replaces the test file by a symlink to a passing one",
          f.diff({"tests/fake.py": "def test_add():\n    assert True\n\n\ndef test_neg():\n    assert True\n"},
                 symlinks={"tests/test_calc.py": "fake.py"}), ("rejected", "unresolved"), None),
        C("tamper_conftest", "tamper", "a root conftest.py forcing every test to pass",
          f.diff({"conftest.py": conftest_force}), ("unresolved",), True),
        C("tamper_conftest_sub", "tamper", "tests/conftest.py forcing every test to pass",
          f.diff({"tests/conftest.py": conftest_force}), ("unresolved",), True),
        C("tamper_pytest_ini", "tamper", "pytest.ini that collects nothing and drops the report",
          f.diff({"pytest.ini": "[pytest]\npython_functions = nothing_\naddopts = -p no:junitxml\n"}),
          ("unresolved",), True),
        C("tamper_pass_to_pass_file", "tamper",
          "fixes add, breaks double() and edits the PASS_TO_PASS test file (not in test_patch) to hide it",
          f.diff({"calc.py": FIX, "util.py": "def double(x):\n    return 3 * x\n",
                  "tests/test_util.py": TESTS_UTIL.replace("== 8", "== 12")}), ("unresolved",), True),
        C("fake_passed_lines", "forge", "prints fake PASSED lines and a passing summary",
          f.calc_patch(wrong, prelude="print('tests/test_calc.py::test_add PASSED')\n"
                       "print('PASSED tests/test_calc.py::test_add')\n"
                       "print('=' * 30 + ' 3 passed in 0.01s ' + '=' * 30)\n"), ("unresolved",), False),
        C("fake_exit_zero", "forge", "forces exit status 0 from an atexit hook",
          f.calc_patch(wrong, prelude="import atexit, os\natexit.register(lambda: os._exit(0))\n"),
          ("unresolved",), False),
        C("early_exit_zero", "forge", "exits 0 at import, before any test runs",
          f.calc_patch(wrong, prelude="import os\nos._exit(0)\n"), ("unresolved",), False),
        C("fake_report_early", "forge", "writes a passing JUnit report at import (pytest overwrites it)",
          f.calc_patch(wrong, prelude=forge + "_forge()\n"), ("unresolved",), False),
        C("fake_report_atexit", "forge", "rewrites the JUnit report from an atexit hook after pytest wrote it",
          f.calc_patch(wrong, prelude=forge + "import atexit\natexit.register(_forge)\n"), ("unresolved",), False,
          suspicious=True),
        # --- patch formats
        C("binary_patch", "patch_format", "a git binary patch plus the fix",
          f.diff({"calc.py": FIX.replace("    return a + b", "    import os\n    data = open(os.path.join("
                                         "os.path.dirname(__file__), 'data.bin'), 'rb').read()\n"
                                         "    return a + b if data == bytes(range(256)) * 4 else None"),
                  "data.bin": bytes(range(256)) * 4}), ("resolved",), False),
        C("non_utf8", "patch_format", "a Latin-1 diff (not UTF-8) plus the fix",
          f.diff({"calc.py": latin1.replace(b"return a + b", b"return a + b if check() else None")}),
          ("resolved",), False),
        C("huge_diff_50mb", "patch_format", "a 50 MB diff", _hand_diff("big.txt", huge_lines), ("rejected",),
          None, "cap"),
        C("malformed_hunk", "patch_format", "hunk line counts that do not match", malformed, ("rejected",), None,
          "hunk"),
        C("truncated_patch", "patch_format", "a diff cut off mid-hunk", gold[: gold.index("+    return") + 6],
          ("rejected",), None),
        C("not_a_diff", "patch_format", "prose instead of a diff", "I fixed it! add() now adds.\n",
          ("rejected",), None, "diff"),
        C("nul_bytes", "patch_format", "a NUL byte in a text hunk", gold.replace("a + b", "a +\x00 b"),
          ("rejected",), None, "NUL"),
        C("stale_context", "patch_format", "context lines that are not in the file", stale, ("patch_failed",),
          None),
        C("empty_patch", "patch_format", "an empty patch", "", ("empty_patch",), None),
        C("whitespace_patch", "patch_format", "a whitespace-only patch", " \n\t\n", ("empty_patch",), None),
        C("empty_new_file", "patch_format", "adds an empty file plus the fix",
          f.diff({"calc.py": FIX, "notes/EMPTY": ""}), ("resolved",), False),
    ]


def build_corpus(out_dir: Path, bait: Bait, *, timeout: float = 20.0) -> dict:
    """Write the corpus under `out_dir`; returns {"instances", "predictions", "repos_dir", "cases"} paths."""
    out_dir = Path(out_dir)
    repos = out_dir / "repos"
    repos.mkdir(parents=True, exist_ok=True)
    reset_dir(bait.escaped_dir)
    bait.secret_file.parent.mkdir(parents=True, exist_ok=True)
    bait.secret_file.write_text(bait.secret + "\n")
    fortress = Fortress(repos)
    cases = _probe_cases(fortress, bait, timeout) + _patch_cases(fortress, bait)
    extra, forging = all_cases(fortress, repos)
    slow = max(timeout + 30, 45)
    cases += [Case(name, "forge", desc, patch, ("unresolved",), None, None, slow if iid == INSTANCE_ID else None,
                   known, iid, susp) for iid, (name, desc, patch, susp, known) in forging]
    for c in cases:
        assert bait.secret not in c.patch, c.name  # the secret may only reach an output by escaping
    (out_dir / "instances.jsonl").write_text("".join(json.dumps(i) + "\n" for i in [fortress.instance(), *extra]))
    line = lambda c: json.dumps({"instance_id": c.instance, "model_name_or_path": MODEL,  # noqa: E731
                                 "rollout_id": c.name, "model_patch": c.patch}) + "\n"
    (out_dir / "predictions.jsonl").write_text("".join(line(c) for c in cases if c.instance == INSTANCE_ID))
    (out_dir / "slow_predictions.jsonl").write_text("".join(line(c) for c in cases if c.instance != INSTANCE_ID))
    meta = [{k: v for k, v in asdict(c).items() if k != "patch"} for c in cases]
    (out_dir / "cases.json").write_text(json.dumps({"bait": asdict(bait), "cases": meta}, indent=1) + "\n")
    return {"instances": out_dir / "instances.jsonl", "predictions": out_dir / "predictions.jsonl",
            "slow_predictions": out_dir / "slow_predictions.jsonl",
            "repos_dir": repos, "cases": cases, "fortress": fortress}


def broken_predictions_file(path: Path, fortress: Fortress) -> dict[str, str]:
    """A predictions file with broken lines among good ones; returns {rollout_id: expected status} of the good
    lines (the only ones that may be evaluated)."""
    good = {"ok_gold": fortress.gold, "ok_wrong": fortress.calc_patch("return a * b")}
    line = lambda rid, patch: json.dumps({"instance_id": INSTANCE_ID, "model_name_or_path": MODEL,  # noqa: E731
                                          "rollout_id": rid, "model_patch": patch}).encode()
    rows = [
        line("ok_gold", good["ok_gold"]),
        b'{"instance_id": "' + INSTANCE_ID.encode() + b'", "rollout_id": "cut", "model_patch": "diff --git a/x',
        b"this is not json at all",
        b'["a", "json", "list"]',
        b'{"instance_id": "' + INSTANCE_ID.encode() + b'", "rollout_id": "num", "model_patch": 42}',
        b'{"rollout_id": "no_instance", "model_patch": ""}',
        b'{"instance_id": "' + INSTANCE_ID.encode() + b'", "rollout_id": "latin1", "model_patch": "caf\xe9"}',
        b"",
        line("ok_wrong", good["ok_wrong"]),
        line("ok_gold", good["ok_wrong"]),  # a duplicate key: skipped, the first one stands
    ]
    path.write_bytes(b"\n".join(rows) + b"\n")
    return {"ok_gold": "resolved", "ok_wrong": "unresolved"}
