"""Which tokenizer and text encoder for text prompts (issue 39 item 2): the measurements behind
bench/text_encoder_choice.md, with the recommended pair (word tokens with hashed character n-grams,
fastText-style [Bojanowski et al. 2017], into a small pre-LN transformer) saved and loaded as `tokenizer/` and
`text_encoder/` components of a diffusers pipeline folder. The pair is denoiser.model.text's: the prototype this
script first carried became that module (bench/text_encoder_choice.md says where they differ).

    nice -n 10 .venv/bin/python bench/text_encoder_choice.py tokens            # 3: tokenization of captions, prompts, typos
    nice -n 10 .venv/bin/python bench/text_encoder_choice.py roundtrip         # 5: save/load + robustness
    PYTHONPATH=/tmp/tk nice -n 10 .venv/bin/python bench/text_encoder_choice.py tokens --bpe   # + BPE/WordPiece
    PYTHONPATH=/tmp/tx nice -n 10 .venv/bin/python bench/text_encoder_choice.py encoder         # 4: encoder vs UNet cost
    PYTHONPATH=/tmp/tx nice -n 10 .venv/bin/python bench/text_encoder_choice.py load            # 2: folder loading
    nice -n 10 .venv/bin/python bench/text_encoder_choice.py cost --tx /tmp/tx --tk /tmp/tk --wheels /tmp/whl  # 1

/tmp/tx holds transformers 5.25.0 + tokenizers 0.23.3 + kernels 0.19.1 (what `pip install transformers` adds to
our venv), /tmp/tk tokenizers alone, each installed with `pip install --no-deps --target`; never into .venv.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from diffusers import DDIMScheduler, DiffusionPipeline

from denoiser.model.text import HashTextEncoder, WordHashTokenizer, fnv1a, words

ROOT = Path(__file__).resolve().parent.parent
METADATA = [Path.home() / ".cache/denoiser/datasets/emoji/metadata.csv",  # the 5-vendor set, with keywords
            ROOT.parent / "shared/data/emoji/metadata.csv"]  # today's 2-vendor set, no keywords

# prompts a person types that are not emoji names (issue 39's examples first), and typos with what was meant
TYPED = ["a red fruit", "sad cat", "japan", "happy face", "a big green tree", "cold drink", "fast red car",
         "broken heart", "laughing so hard", "small yellow bird", "the flag of france", "slice of pizza",
         "a dog in the rain", "birthday party", "money", "angry man", "sun behind clouds", "musical instrument",
         "sports ball", "ice cream", "rocket to the moon", "crying baby", "spooky ghost", "love letter"]
TYPOS = {"appel": "apple", "smiling fase": "smiling face", "piza": "pizza", "hart": "heart", "catt": "cat",
         "bannana": "banana", "japn": "japan", "rainbw": "rainbow", "thumbs upp": "thumbs up",
         "smilling": "smiling"}


# ---------------------------------------------------------------- captions
def emoji_rows() -> tuple[Path, list[dict]]:
    """One row per emoji name (vendors collapsed) from the first metadata.csv found."""
    path = next(p for p in METADATA if p.is_file())
    rows: dict[str, dict] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            rows.setdefault(r["name"], r)
    return path, list(rows.values())


def captions(rows: list[dict]) -> dict[str, list[str]]:
    """The caption kinds issue 39 item 4 draws from: name, short name, one keyword, all keywords, category."""
    out: dict[str, list[str]] = {"name": [], "short_name": [], "keyword": [], "keywords": [], "category": []}
    for r in rows:
        out["name"].append(r["name"])
        out["short_name"].append(r["short_name"].replace("_", " "))
        kws = [k for k in r.get("keywords", "").split("|") if k]
        out["keyword"] += kws
        if kws:
            out["keywords"].append(", ".join(kws))
        out["category"].append(r["category"])
        out["category"].append(r["subcategory"].replace("-", " "))
    return out


def corpus(caps: dict[str, list[str]]) -> list[str]:
    return [c for kind in ("name", "short_name", "keyword", "category") for c in caps[kind]]


# ---------------------------------------------------------------- 1. cost: size and import time
def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def import_time(code: str, pythonpath: str | None, repeats: int = 5) -> tuple[float, float]:
    """Median wall and CPU (user + sys) seconds of `python -c code` in a fresh process; the CPU time is what
    a shared machine's load changes least."""
    import resource

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    wall, cpu = [], []
    for _ in range(repeats + 1):  # the first run warms the page cache and is dropped
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        wall.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(wall[1:]), statistics.median(cpu[1:])


def cmd_cost(args) -> None:
    print(f"load: {os.getloadavg()}")
    for whl in sorted(Path(args.wheels).glob("*.whl")) if args.wheels else []:
        if whl.name.split("-")[0] in ("transformers", "tokenizers", "kernels"):
            print(f"wheel {whl.name}: {whl.stat().st_size / 1e6:.1f} MB")
    for name, p in (("transformers+tokenizers+kernels", args.tx), ("tokenizers", args.tk)):
        parts = {d.name: du(d) for d in Path(p).iterdir() if d.is_dir() and not d.name.endswith("-info")}
        print(f"installed {name}: {du(Path(p)) / 2**20:.1f} MiB  " + "  ".join(f"{k} {v / 2**20:.1f}" for k, v in parts.items()))
    rows = [("python -c pass", "pass", None),
            ("import torch", "import torch", None),
            ("import diffusers", "import diffusers", None),
            ("import denoiser.sampling.pipeline", "import denoiser.sampling.pipeline", None),
            ("import tokenizers", "import tokenizers", args.tk),
            ("import transformers", "import transformers", args.tx),
            ("from transformers import CLIPTextModel, CLIPTokenizerFast",
             "from transformers import CLIPTextModel, CLIPTokenizerFast", args.tx),
            ("import denoiser.sampling.pipeline + CLIPTextModel",
             "import denoiser.sampling.pipeline; from transformers import CLIPTextModel, CLIPTokenizerFast", args.tx)]
    for label, code, path in rows:
        wall, cpu = import_time(code, path, args.repeats)
        print(f"{label:60s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  (median of {args.repeats} runs)  load {os.getloadavg()[0]:.1f}")
    print(f"load: {os.getloadavg()}")


# ---------------------------------------------------------------- 3. tokenization
def ngram_bag(tok: WordHashTokenizer, word: str) -> Counter:
    return Counter(tok.units(word)[1:])


def cosine(a: Counter, b: Counter) -> float:
    dot = sum(v * b[k] for k, v in a.items())
    return dot / math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()) or 1)


def token_stats(name: str, tokenize, caps: dict[str, list[str]]) -> None:
    lens = {k: [len(tokenize(c)) for c in v] for k, v in caps.items() if v}
    every = [n for v in lens.values() for n in v]
    per = "  ".join(f"{k} {statistics.mean(v):.1f}/{max(v)}" for k, v in lens.items())
    print(f"  {name}: tokens per caption mean/max: all {statistics.mean(every):.2f}/{max(every)}  ({per})")


def cmd_tokens(args) -> None:
    path, rows = emoji_rows()
    caps = captions(rows)
    texts = corpus(caps)
    print(f"{path}: {len(rows)} emoji, {len(texts)} captions (name, short name, each keyword, category, subcategory)")
    typed_words = [w for p in TYPED for w in words(p)]
    typo_words = [w for t in TYPOS for w in words(t)]
    vocab = Counter(w for c in texts for w in words(c))
    print("\nword-level")
    print(f"  vocabulary: {len(vocab)} words ({sum(1 for c in vocab.values() if c >= 2)} seen twice or more)")
    token_stats("word", words, caps)
    known = [w for w in typed_words if w in vocab]
    print(f"  typed prompts: {len(known)}/{len(typed_words)} words known ({len(known) / len(typed_words):.0%}); "
          f"unknown: {sorted(set(typed_words) - set(vocab))}")
    print("  typos: " + "; ".join(f"{t!r} -> {[w if w in vocab else '[UNK]' for w in words(t)]}" for t in TYPOS))

    print("\ncharacter n-grams + word, hashed (FNV-1a)")
    for (lo, hi), buckets in [(r, b) for r in ((3, 5), (2, 4)) for b in (4096, 8192, 16384, 32768)]:
        tok = WordHashTokenizer(num_buckets=buckets, min_n=lo, max_n=hi)
        units = {u for w in vocab for u in tok.units(w)}
        by_bucket = Counter(fnv1a(u) % buckets for u in units)
        shared = sum(1 for u in units if by_bucket[fnv1a(u) % buckets] > 1)
        print(f"  n = {lo}-{hi}, {buckets:6d} buckets: {len(units)} distinct units in the captions, {len(by_bucket)} buckets used, "
              f"{shared / len(units):.0%} of units share their bucket; {buckets * 256 / 1e6:.1f} M params at D=256")
    tok = WordHashTokenizer()
    seen = {u for w in vocab for u in tok.units(w)}
    token_stats("hash (= words)", words, caps)
    signature = Counter(tuple(sorted(set(tok.word_ids(w)))) for w in vocab)
    print(f"  n = {tok.config.min_n}-{tok.config.max_n}, 16384 buckets: {sum(c for c in signature.values() if c > 1)} of {len(vocab)} caption words share "
          "their whole set of buckets with another word")
    share = [statistics.mean(u in seen for u in tok.units(w)) for w in typed_words + typo_words]
    n = len(typed_words)
    print(f"  typed prompts: {sum(s > 0 for s in share[:n])}/{n} words have a seen unit; mean share of a word's "
          f"units seen {statistics.mean(share[:n]):.0%}; typo words: {statistics.mean(share[n:]):.0%}")
    bags = {w: ngram_bag(tok, w) for w in vocab}
    for w in typo_words:
        if w in vocab:
            continue
        near = sorted(vocab, key=lambda v: -cosine(bags[v], ngram_bag(tok, w)))[:3]
        sims = [f"{v} {cosine(bags[v], ngram_bag(tok, w)):.2f}" for v in near]
        print(f"  typo {w!r}: nearest caption words by shared n-grams: {', '.join(sims)}")
    for w in ("fruit", "japan", "france", "spooky", "instrument"):
        near = sorted(vocab, key=lambda v: -cosine(bags[v], ngram_bag(tok, w)))[:3]
        print(f"  {w!r} ({'known' if w in vocab else 'unknown'}): nearest {near}")
    typo_recovery(vocab, typed_words)
    if args.bpe:
        bpe_stats(texts, caps, typed_words, typo_words)


def single_edits(word: str, k: int) -> list[str]:
    """Deterministic one-edit typos of `word`: a deletion, a swap of neighbours, a doubled letter, a substitution
    by the next letter on the keyboard row, each at position k % len."""
    rows, i = "qwertyuiop asdfghjkl zxcvbnm", k % len(word)
    j = min(i, len(word) - 2)
    near = rows[rows.index(word[i]) + 1] if word[i] in rows and rows.index(word[i]) + 1 < len(rows) else "e"
    out = [word[:i] + word[i + 1:], word[:j] + word[j + 1] + word[j] + word[j + 2:], word[:i] + word[i] + word[i:],
           word[:i] + (near if near != " " else "a") + word[i + 1:]]
    return [t for t in out if t != word]


def typo_recovery(vocab: Counter, typed_words: list[str]) -> None:
    """For single-edit typos of the typed prompts' words (4+ letters): how often the caption word sharing most
    hashed units is the intended one: what an embedding built from n-grams starts from."""
    targets = sorted({w for w in typed_words if len(w) >= 4 and w in vocab})
    for lo, hi in ((2, 4), (3, 5), (3, 6)):
        tok = WordHashTokenizer(min_n=lo, max_n=hi, max_ngrams=64)
        index: dict[str, list[str]] = {}
        norm = {}
        for w in vocab:
            us = set(tok.units(w)[1:]) or {tok.units(w)[0]}
            norm[w] = math.sqrt(len(us))
            for u in us:
                index.setdefault(u, []).append(w)
        hit = total = 0
        for w in targets:
            for k in range(3):
                for typo in single_edits(w, k):
                    if typo in vocab:
                        continue
                    us = set(tok.units(typo)[1:]) or {tok.units(typo)[0]}
                    score = Counter(v for u in us for v in index.get(u, ()))
                    best = max(score, key=lambda v: (score[v] / norm[v], v), default=None)  # ties: by name, not by hash order
                    hit += best == w
                    total += 1
        print(f"  typos of {len(targets)} typed words, n = {lo}-{hi}: nearest caption word is the intended one "
              f"for {hit}/{total} ({hit / total:.0%}) one-edit typos")


def bpe_stats(texts, caps, typed_words, typo_words) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    for kind, size in (("BPE", 1000), ("BPE", 2000), ("BPE", 4000), ("WordPiece", 2000)):
        if kind == "BPE":
            tk = Tokenizer(models.BPE(unk_token="[UNK]"))
            trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=["[PAD]", "[UNK]"])
        else:
            tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
            trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=["[PAD]", "[UNK]"])
        tk.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()])
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
        tk.train_from_iterator(texts, trainer)
        print(f"\n{kind} {size} (tokenizers, trained on the {len(texts)} captions)")
        print(f"  vocabulary: {tk.get_vocab_size()}")
        token_stats("pieces (punctuation pieces not counted)", lambda c, tk=tk: [x for x in tk.encode(c).tokens if re.search(r"\w", x)], caps)
        whole = sum(len(tk.encode(w).tokens) == 1 for w in typed_words)
        unk = sum("[UNK]" in tk.encode(w).tokens for w in typed_words)
        pieces = statistics.mean(len(tk.encode(w).tokens) for w in typed_words)
        print(f"  typed prompts: {whole}/{len(typed_words)} words are one token; {unk} hold [UNK]; "
              f"{pieces:.2f} pieces per word")
        print("  typos: " + "; ".join(f"{t!r} -> {tk.encode(t).tokens}" for t in TYPOS))


# ---------------------------------------------------------------- 4. encoder cost
def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def cmd_encoder(args) -> None:
    from denoiser.folders.model_dir import load_model

    torch.manual_seed(0)
    B = 64
    unet, _ = load_model(ROOT / "weights/emoji")
    x, t, y = torch.randn(B, 3, 32, 32), torch.randint(0, 1000, (B,)), torch.randint(0, 9, (B,))
    cases = {}

    def unet_call():
        with torch.no_grad():
            unet(x, t, y)

    cases["UNet emoji, one call (no grad)"] = (unet_call, sum(p.numel() for p in unet.parameters()))
    prompts = ([c for c in TYPED] * 3)[:B]
    for L in (16, 32):
        for layers, D in ((2, 128), (2, 256), (4, 256)):
            tok = WordHashTokenizer(max_length=L)
            enc = HashTextEncoder(hidden_size=D, num_layers=layers, num_heads=4, max_length=L).eval()
            batch = tok([(p + " ") * 8 for p in prompts])  # every prompt cut at L words: the worst case
            n = sum(p.numel() for p in enc.parameters())

            def fwd(enc=enc, batch=batch):
                with torch.no_grad():
                    enc(**batch)

            def train(enc=enc, batch=batch):
                enc(**batch).square().mean().backward()

            cases[f"hash + nn.TransformerEncoder L={L} {layers}x{D} fwd"] = (fwd, n)
            cases[f"hash + nn.TransformerEncoder L={L} {layers}x{D} fwd+bwd"] = (train, n)
            try:
                from transformers import CLIPTextConfig, CLIPTextModel
            except ImportError:
                continue
            clip = CLIPTextModel(CLIPTextConfig(vocab_size=4096, hidden_size=D, intermediate_size=4 * D,
                                                num_hidden_layers=layers, num_attention_heads=4,
                                                max_position_embeddings=L)).eval()
            ids, mask = torch.randint(0, 4096, (B, L)), torch.ones(B, L, dtype=torch.long)

            def clip_fwd(clip=clip, ids=ids, mask=mask):
                with torch.no_grad():
                    clip(input_ids=ids, attention_mask=mask)

            cases[f"CLIPTextModel vocab 4096 L={L} {layers}x{D} fwd"] = (clip_fwd, sum(p.numel() for p in clip.parameters()))
    tok = WordHashTokenizer()
    cases["WordHashTokenizer, 64 typed prompts"] = (lambda: tok(prompts), 0)
    for fn, _ in cases.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in cases}
    print(f"load before: {os.getloadavg()}  threads {torch.get_num_threads()}")
    for _ in range(args.repeats):  # interleaved rounds: a load spike hits every case alike
        for k, (fn, _) in cases.items():
            times[k] += timed(fn, 1)
    print(f"load after: {os.getloadavg()}")
    ref = statistics.median(times["UNet emoji, one call (no grad)"])
    print(f"{'case (batch 64)':62s} {'params':>9s} {'ms':>8s} {'/ UNet':>7s}")
    for k, (_, n) in cases.items():
        m = statistics.median(times[k])
        print(f"{k:62s} {n / 1e6:8.2f}M {m * 1e3:8.1f} {m / ref:7.3f}")


# ---------------------------------------------------------------- 2. + 5. loading and the round trip
class TextPipeline(DiffusionPipeline):
    """A stand-in for DenoiserPipeline with the two text components: what its __init__ will take."""

    _optional_components = ["text_encoder", "tokenizer"]

    def __init__(self, unet, scheduler, text_encoder=None, tokenizer=None):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler, text_encoder=text_encoder, tokenizer=tokenizer)


def tiny_unet(D: int | None):
    from denoiser.model.unet import UNet

    return UNet(sample_size=8, base_channels=32, channel_mult=(1, 2), layers_per_block=1,
                attention_resolutions=(4,), num_heads=2, cross_attention_dim=D)


def try_load(label: str, folder: Path, cls=TextPipeline) -> object | None:
    try:
        pipe = cls.from_pretrained(folder)
    except Exception as err:  # what diffusers says is the finding
        print(f"  {label}: FAILS: {type(err).__name__}: {str(err).splitlines()[0][:260]}")
        return None
    comps = {k: type(v).__name__ for k, v in pipe.components.items()}
    print(f"  {label}: loads: {comps}")
    print(f"    model_index.json: {json.loads((folder / 'model_index.json').read_text())}")
    print(f"    files: {sorted(str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file())}")
    return pipe


def cmd_load(args) -> None:
    with tempfile.TemporaryDirectory(prefix="text_encoder_choice_") as d:
        load_cases(Path(d))


def load_cases(out: Path) -> None:
    mod = sys.modules[__name__]
    if __name__ == "__main__":  # diffusers records a component's module; "__main__" is no name to load by
        sys.path.insert(0, str(Path(__file__).parent))
        import text_encoder_choice as mod
    sched = DDIMScheduler()
    print(f"offline: HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE')}; folders under {out}")
    # (c) our own module: denoiser.model.text's tokenizer and encoder
    tok, enc = WordHashTokenizer(), HashTextEncoder(hidden_size=64, num_layers=1)
    TextPipeline(tiny_unet(64), sched, enc, tok).save_pretrained(out / "own")
    own = try_load("(c) own WordHashTokenizer + HashTextEncoder", out / "own", mod.TextPipeline)
    if own is not None:
        b = own.tokenizer(["red apple", ""])
        same = torch.equal(own.text_encoder(**b), enc(**b))
        print(f"    round trip: same encoder output {same}")
    # a folder of today (no text entries) under the class with optional text components
    TextPipeline(tiny_unet(None), sched).save_pretrained(out / "class_model")
    try_load("class model under the text-capable class ([null, null] entries)", out / "class_model", mod.TextPipeline)
    mi = json.loads((out / "class_model/model_index.json").read_text())
    mi.pop("text_encoder"), mi.pop("tokenizer")
    (out / "class_model/model_index.json").write_text(json.dumps(mi))
    try_load("today's model_index.json (no text entries) under the text-capable class", out / "class_model", mod.TextPipeline)
    try:
        import tokenizers
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        print("  (b), (a): skipped, tokenizers not importable (set PYTHONPATH=/tmp/tk or /tmp/tx)")
        return
    bpe = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(corpus(captions(emoji_rows()[1])), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|startoftext|>", "<|endoftext|>", "[UNK]"], end_of_word_suffix="</w>"))
    # (b) a bare `tokenizers` tokenizer named in model_index.json
    (out / "tok_only").mkdir()
    TextPipeline(tiny_unet(64), sched, enc, None).save_pretrained(out / "tok_only")
    (out / "tok_only/tokenizer").mkdir()
    bpe.save(str(out / "tok_only/tokenizer/tokenizer.json"))
    mi = json.loads((out / "tok_only/model_index.json").read_text())
    mi["tokenizer"] = ["tokenizers", "Tokenizer"]
    (out / "tok_only/model_index.json").write_text(json.dumps(mi))
    try_load(f"(b) ['tokenizers', 'Tokenizer'] (tokenizers {tokenizers.__version__}, imported)", out / "tok_only", mod.TextPipeline)
    try:
        import transformers
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizerFast, PreTrainedTokenizerFast
    except ImportError:
        print("  (a): skipped, transformers not importable (set PYTHONPATH=/tmp/tx)")
        return
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=2, max_position_embeddings=32))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]", pad_token="<|endoftext|>", model_max_length=32)
    TextPipeline(tiny_unet(64), sched, clip, fast).save_pretrained(out / "clip_fast")
    try_load(f"(a) CLIPTextModel + PreTrainedTokenizerFast (transformers {transformers.__version__})", out / "clip_fast", mod.TextPipeline)
    bpe.model.save(str(out), "bpe")  # vocab.json + merges.txt, the files CLIPTokenizerFast is built from
    try:
        clip_tok = CLIPTokenizerFast(vocab_file=str(out / "bpe-vocab.json"), merges_file=str(out / "bpe-merges.txt"),
                                     unk_token="[UNK]", model_max_length=32)
        TextPipeline(tiny_unet(64), sched, clip, clip_tok).save_pretrained(out / "clip_clip")
        pipe = try_load("(a) CLIPTextModel + CLIPTokenizerFast", out / "clip_clip", mod.TextPipeline)
    except Exception as err:
        print(f"  (a) CLIPTokenizerFast from our BPE: FAILS to build or save: {type(err).__name__}: {str(err)[:200]}")
        pipe = None
    if pipe is not None:
        try:
            print(f"    'red appel' -> {pipe.tokenizer.tokenize('red appel')}")
        except Exception as err:
            print(f"    loaded, but tokenizing 'red appel' FAILS: {type(err).__name__}: {str(err)[:200]}")


def cmd_roundtrip(args) -> None:
    """Save and load denoiser.model.text's pair, and feed it what people type; prints what every prompt gives."""
    mod = sys.modules[__name__]
    if __name__ == "__main__":
        sys.path.insert(0, str(Path(__file__).parent))
        import text_encoder_choice as mod
    torch.manual_seed(0)
    tok, enc = WordHashTokenizer(max_length=32), HashTextEncoder().eval()
    with tempfile.TemporaryDirectory() as d:
        mod.TextPipeline(tiny_unet(256), DDIMScheduler(), enc, tok).save_pretrained(d)
        size = {p.name: p.stat().st_size for p in Path(d).rglob("*") if p.is_file() and p.parent.name in ("text_encoder", "tokenizer")}
        pipe = mod.TextPipeline.from_pretrained(d)
        print(f"files: {size}")
        print(f"tokenizer/tokenizer_config.json: {json.loads((Path(d) / 'tokenizer/tokenizer_config.json').read_text())}")
    prompts = ["red apple", "appel", "smiling fase", "a red fruit", "日本", "🍎 apple!!", "", "   ", "?!",
               "flag: Japan", "keycap: #", "piñata", "word " * 500, "x" * 10_000]
    b = pipe.tokenizer(prompts)
    with torch.no_grad():
        h = pipe.text_encoder(**b)
        same = torch.equal(h, enc(**b))
        eps = pipe.unet(torch.randn(len(prompts), 3, 8, 8), torch.full((len(prompts),), 500),
                        encoder_hidden_states=h, encoder_attention_mask=b["attention_mask"]).sample
    print(f"batch of {len(prompts)}: input_ids {tuple(b['input_ids'].shape)}, attention_mask {tuple(b['attention_mask'].shape)}, "
          f"hidden {tuple(h.shape)}, finite {bool(h.isfinite().all())}, equal after reload {same}, UNet out finite "
          f"{bool(eps.isfinite().all())}")
    for i, p in enumerate(prompts):
        shown = p if len(p) < 30 else p[:20] + f"... ({len(p)} chars)"
        print(f"  {shown!r:40s} words {int(b['attention_mask'][i].sum()):2d}  {[w[:12] for w in words(p)[:6]]}  |h| {h[i].norm():.2f}")
    # "" alone: a (1, 1) mask of 0 and zero states; the UNet's cross-attention then adds nothing
    e = pipe.tokenizer("")
    he = pipe.text_encoder(**e)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        a = pipe.unet(x, 500, encoder_hidden_states=he, encoder_attention_mask=e["attention_mask"]).sample
        n = pipe.unet(x, 500).sample
    print(f"'' -> attention_mask {e['attention_mask'].tolist()}, hidden {tuple(he.shape)} all zero {bool((he == 0).all())}; "
          f"UNet with it equals UNet with no prompt: {torch.equal(a, n)}")
    try:
        pipe.tokenizer([None])
    except TypeError as err:
        print(f"non-string prompt -> TypeError: {err}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--tx", default="/tmp/tx")
    c.add_argument("--tk", default="/tmp/tk")
    c.add_argument("--repeats", type=int, default=5)
    c.add_argument("--wheels", default=None, help="a folder of the wheels (`pip download --no-deps -d`), to size them")
    t = sub.add_parser("tokens")
    t.add_argument("--bpe", action="store_true", help="also BPE/WordPiece (needs tokenizers on PYTHONPATH)")
    e = sub.add_parser("encoder")
    e.add_argument("--repeats", type=int, default=7)
    sub.add_parser("load")
    sub.add_parser("roundtrip")
    args = p.parse_args()
    {"cost": cmd_cost, "tokens": cmd_tokens, "encoder": cmd_encoder, "load": cmd_load, "roundtrip": cmd_roundtrip}[args.cmd](args)


if __name__ == "__main__":
    main()
