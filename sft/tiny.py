"""A tiny random causal LM + a tokenizer trained on the spot, for tests and the CPU demo.

No model hub is reachable on the machines this product is tested on, so every test that needs "a model" builds
one here: a random `Qwen2ForCausalLM` (same architecture family as real coder models, so the LoRA target modules,
the chat template handling and the generation code paths are the real ones) and a byte-level BPE tokenizer trained
on a built-in corpus of code, diffs, JSON and prose so that prompts of a few thousand characters stay a few hundred
to a few thousand tokens. The chat template wraps assistant content in `{% generation %}` so TRL's
`assistant_only_loss=True` (and `return_assistant_tokens_mask=True`) work.

Usage: `build_tiny_model(dir)` or `python -m sft.tiny --out DIR`.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from gagar.args import ArgumentParser

# Bump when the corpus, the template or the architecture changes, so cached dirs are rebuilt.
_BUILD_VERSION = 1  # the corpus/phrase knobs enter the key only when set, so v1 caches stay valid
_MARKER = "gagar_tiny_model.json"

IM_START, IM_END, EOT, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = [EOT, IM_START, IM_END, PAD]

# Qwen-style ChatML. Roles are free-form (system/user/assistant/tool all render the same way) so whatever
# role the grader gives a tool result is trained and inferred identically. Only assistant content and its
# closing <|im_end|> are inside {% generation %}: that is what the model must learn to emit, end marker included.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- elif message['content'] is none -%}{%- set content = '' -%}"
    "{%- else -%}{%- set content = message['content'] | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- content + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- elif message['role'] == 'tool' and message.get('name') -%}"
    "{{- '<|im_start|>tool name=' + message['name'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_PY = '''\
import json
import os
from pathlib import Path


def parse_config(path: str) -> dict:
    """Read a JSON config file and return its values."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object, got {type(data).__name__}")
    return data


class Calculator:
    def __init__(self, precision: int = 2) -> None:
        self.precision = precision
        self.history: list[float] = []

    def add(self, a: float, b: float) -> float:
        result = round(a + b, self.precision)
        self.history.append(result)
        return result

    def divide(self, a: float, b: float) -> float:
        if b == 0:
            raise ZeroDivisionError("division by zero")
        return round(a / b, self.precision)


def test_add():
    assert Calculator().add(1, 2) == 3


def main(argv=None):
    for name in sorted(os.listdir(".")):
        if name.endswith(".py") and not name.startswith("_"):
            print(Path(name).stem)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

_GO = """\
package calc

import (
\t"errors"
\t"fmt"
\t"strings"
)

// Add returns the sum of a and b.
func Add(a, b int) int {
\treturn a + b
}

func Divide(a, b int) (int, error) {
\tif b == 0 {
\t\treturn 0, errors.New("division by zero")
\t}
\treturn a / b, nil
}

func Join(parts []string) string {
\tfmt.Println("joining", len(parts))
\treturn strings.Join(parts, ",")
}

func TestAdd(t *testing.T) {
\tif got := Add(1, 2); got != 3 {
\t\tt.Fatalf("Add(1, 2) = %d, want 3", got)
\t}
}
"""

_JAVA = """\
package calc;

import java.util.ArrayList;
import java.util.List;

public class Calculator {
    private final List<Integer> history = new ArrayList<>();

    public int add(int a, int b) {
        int result = a + b;
        history.add(result);
        return result;
    }

    public int divide(int a, int b) {
        if (b == 0) {
            throw new IllegalArgumentException("division by zero");
        }
        return a / b;
    }

    public static void main(String[] args) {
        System.out.println(new Calculator().add(1, 2));
    }
}

class CalculatorTest {
    @Test
    void addsNumbers() {
        assertEquals(3, new Calculator().add(1, 2));
    }
}
"""

_PROSE = """\
You are a careful code reviewer. Several candidate patches for the same issue all pass the tests. Rank them from
best to worst by approach suitability, implementation precision, minimality, absence of side effects and the
conventions of the codebase. Every negative judgment must cite a file and line, a hunk, or a test result.
Issue: the function returns the wrong value when the input list is empty. Expected behaviour: return zero and do
not raise. Steps to reproduce: call the function with an empty list and observe the error in the traceback.
Candidate A changes one line in the function. Candidate B also adds debug output and an unused helper. Candidate C
reformats an unrelated file and renames a variable outside the fix. The tests FAIL_TO_PASS and PASS_TO_PASS pass.
"""


_STDLIB_FILES = (
    "textwrap.py",
    "difflib.py",
    "json/decoder.py",
    "json/encoder.py",
    "shlex.py",
    "dataclasses.py",
    "unittest/case.py",
)


def _corpus() -> list[str]:
    """Deterministic training text: sources, unified diffs between variants of them, JSON records, prose."""
    texts = [_PY, _GO, _JAVA, _PROSE]
    for name, src in (("calc.py", _PY), ("calc.go", _GO), ("Calculator.java", _JAVA)):
        lines = src.splitlines(keepends=True)
        edited = [ln.replace("return", "return  ") if i % 7 == 0 else ln for i, ln in enumerate(lines)]
        edited.insert(len(edited) // 2, "    # TODO: remove debug output\n")
        diff = "".join(difflib.unified_diff(lines, edited, f"a/{name}", f"b/{name}"))
        texts.append(f"diff --git a/{name} b/{name}\nindex 1a2b3c4..5d6e7f8 100644\n{diff}")
    record = {
        "instance_id": "owner__repo-1",
        "ranking": ["0", "2", "1"],
        "tiers": {"0": 1, "2": 2, "1": 3},
        "evidence": {"1": ["calc.py:12 adds a print() debug statement", "hunk @@ -3,6 +3,9 @@ dead helper"]},
        "tool": "read_file",
        "args": {"candidate": "1", "path": "src/calc.py", "start": 1, "end": 40},
        "status": "resolved",
        "tests_status": {"FAIL_TO_PASS": {"success": ["tests/test_calc.py::test_add"], "failure": []}},
    }
    texts.append(json.dumps(record))
    texts.append(json.dumps(record, indent=2))
    # The built-in snippets are small; real Python (code + English docstrings) from the standard library gives
    # the BPE enough text to learn useful merges, and diffs between edited copies of it teach the diff syntax.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for rel in _STDLIB_FILES:
        try:
            src = (stdlib / rel).read_text(encoding="utf-8")
        except OSError:
            continue
        texts.append(src)
        lines = src.splitlines(keepends=True)[:400]
        edited = [ln.replace("self", "this") if i % 5 == 0 else ln for i, ln in enumerate(lines)]
        texts.append("".join(difflib.unified_diff(lines, edited, f"a/src/{rel}", f"b/src/{rel}")))
    # Repeats give the frequent Go/Java/JSON n-grams enough weight to become merges.
    return texts + [_GO, _JAVA, _PROSE] * 6


def corpus_texts(path: str | os.PathLike) -> list[str]:
    """The distinct lines of the messages of a chat-records JSONL (e.g. `gagar sft data`'s train.jsonl).

    Each distinct line once: the merges then fit the *kind* of text a judge reads (diffs, findings, answers)
    without memorising one instance's problem statement by repetition (it recurs in every group of that
    instance), which would make held-out prompts tokenise longer than anything seen in training.
    """
    from sandbox.jsonl import read_jsonl

    seen: dict[str, None] = {}
    for rec in read_jsonl(path):  # records we wrote: a bad line is an error naming it, not a silent gap
        for m in rec.get("messages") or []:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                for ln in c.splitlines():
                    seen.setdefault(ln, None)
    return list(seen)


def frequent_lines(path: str | os.PathLike, *, share: float = 0.3, min_chars: int = 24, limit: int = 256) -> list[str]:
    """Lines that recur in at least `share` of the records (the system prompt, fixed headings), longest first.

    They become single tokens: a small model then spends no compute re-reading boilerplate that is identical
    in every conversation. A `share` well above one instance's portion keeps problem statements out.
    """
    from collections import Counter

    counts: Counter[str] = Counter()
    records = 0
    from sandbox.jsonl import read_jsonl

    for rec in read_jsonl(path):
        records += 1
        msgs = rec.get("messages")
        # Prompts only: an answer made one token (a tiny corpus repeats its few answers) leaves nothing to learn.
        lines = {ln for m in msgs or [] if isinstance(m, dict) and isinstance(m.get("content"), str)
                 and m.get("role") != "assistant" for ln in m["content"].splitlines() if len(ln) >= min_chars}
        counts.update(lines)
    keep = [ln for ln, c in counts.items() if records and c >= share * records]
    # An added token matches anywhere, so a line that begins a longer one (`Candidates ...: A, B` inside
    # `Candidates ...: A, B, C`) would swallow part of it and hide what differs (here: how many candidates).
    keep = [ln for ln in keep if not any(o != ln and o.startswith(ln) for o in counts)]
    return sorted(keep, key=lambda ln: (-len(ln), ln))[:limit]


def _file_digest(path: str | None) -> str | None:
    if not path:
        return None
    from sandbox.report import file_sha256

    return file_sha256(path)[:16]


def _phrases_digest() -> str:
    # A corpus-fit tokenizer holds the judge's candidate phrases: a change to them must rebuild cached models.
    import hashlib

    from grader.judge.prompt import candidate_phrases

    return hashlib.sha256("\n".join(candidate_phrases()).encode()).hexdigest()[:16]


def _cache_key(seed: int, hidden_size: int, num_layers: int, vocab_size: int, **arch: object) -> dict:
    key = {
        "version": _BUILD_VERSION,
        # The corpus includes standard-library sources, which differ between Python versions.
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "seed": seed,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "vocab_size": vocab_size,
    }
    key.update({k: v for k, v in arch.items() if v is not None})  # unset knobs keep old keys (and caches) valid
    return key


def _train_tokenizer(vocab_size: int, extra: list[str] | None = None, phrases: list[str] | None = None):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Exactly Qwen2's pipeline: AutoTokenizer maps model_type qwen2 to Qwen2Tokenizer, which rebuilds the
    # normalizer and pre-tokenizer from these settings, so training with anything else would make the loaded
    # tokenizer split text differently from the one the merges were learned on.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is in the vocabulary, so any text (any language, any binary-ish diff) encodes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() + list(extra or []), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        model_max_length=8192,
        padding_side="right",
    )
    fast.add_special_tokens({"additional_special_tokens": [IM_START, EOT]})
    if phrases:
        from tokenizers import AddedToken

        fast.add_tokens([AddedToken(p, normalized=False, special=False) for p in phrases])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build(target: Path, key: dict) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    extra = corpus_texts(key["corpus"]) if key.get("corpus") else None
    phrases = None
    if key.get("corpus"):
        from grader.judge.prompt import candidate_phrases

        # The judge's own format, beside what recurs in its corpus: each letter-bearing key is one token.
        frequent = frequent_lines(key["corpus"])
        phrases = frequent + [p for p in candidate_phrases() if p not in frequent]
    tokenizer = _train_tokenizer(key["vocab_size"] - len(phrases or []), extra, phrases)
    if len(tokenizer) > key["vocab_size"]:
        raise ValueError(f"vocab_size={key['vocab_size']} is smaller than the tokenizer ({len(tokenizer)})")
    hidden = key["hidden_size"]
    heads = int(key.get("num_heads") or max(1, hidden // 16))
    config = Qwen2Config(
        vocab_size=key["vocab_size"],
        hidden_size=hidden,
        intermediate_size=int(key.get("intermediate_size") or hidden * 2),
        num_hidden_layers=key["num_layers"],
        num_attention_heads=heads,
        num_key_value_heads=int(key.get("num_kv_heads") or max(1, heads // 2)),
        max_position_embeddings=int(key.get("max_positions") or 8192),
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(key["seed"])
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(EOT)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / _MARKER).write_text(json.dumps(key, sort_keys=True) + "\n", encoding="utf-8")


def _matches(marker: Path, key: dict) -> bool:
    try:
        return json.loads(marker.read_text(encoding="utf-8")) == key
    except (OSError, json.JSONDecodeError):
        return False


def build_tiny_model(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 4096,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int | None = None,
    corpus: str | os.PathLike | None = None,
) -> Path:
    """Write (or reuse) a tiny random Qwen2 model + tokenizer at `out_dir` and return its path.

    `corpus` (a chat-records JSONL) adds its distinct texts to the tokenizer's training text, so the merges fit
    judge conversations; the other knobs shape a compact Qwen2 (e.g. the from-scratch judge of `make judge`).
    The directory is reused when it already holds a model built with the same arguments; it is built in a
    sibling temp dir and renamed into place, so an interrupted build never leaves a half-written model.
    A non-empty `out_dir` that is not a tiny model built here is refused rather than overwritten.
    """
    if hidden_size % 16 or hidden_size < 16:
        raise ValueError(f"hidden_size must be a positive multiple of 16, got {hidden_size}")
    if num_layers < 1 or vocab_size < 512:
        raise ValueError("num_layers must be >= 1 and vocab_size >= 512 (256 bytes + merges + specials)")
    target = Path(out_dir).resolve()
    if num_heads and hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not a multiple of num_heads {num_heads}")
    corpus_path = str(Path(corpus).resolve()) if corpus else None
    key = _cache_key(seed, hidden_size, num_layers, vocab_size, num_heads=num_heads, num_kv_heads=num_kv_heads,
                     intermediate_size=intermediate_size, max_positions=max_positions, corpus=corpus_path,
                     corpus_sha256=_file_digest(corpus_path), candidate_phrases=_phrases_digest() if corpus_path else None)
    marker = target / _MARKER
    if _matches(marker, key):
        return target
    # A marker with other arguments is a stale tiny model, rebuilt below; anything else non-empty is not ours.
    if not marker.is_file() and target.exists() and any(target.iterdir()):
        raise FileExistsError(
            f"{target} is not empty and is not a tiny model built by sft.tiny; pick another dir"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _build(tmp, key)
        if _matches(marker, key):
            return target  # another process built the same model meanwhile: keep theirs
        if target.exists():
            # Either empty or a stale tiny model (marker checked above): safe to replace.
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _matches(marker, key):  # lost a race to a concurrent build of the same model: fine
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m sft.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args(argv)
    try:
        path = build_tiny_model(
            args.out,
            seed=args.seed,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            vocab_size=args.vocab_size,
        )
    except (ValueError, FileExistsError) as exc:
        print(f"sft.tiny: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
