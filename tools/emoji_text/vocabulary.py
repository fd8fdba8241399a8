"""The caption words of the emoji text model (weights/emoji/tokenizer/vocabulary.txt), rebuilt from its data's source.

    .venv/bin/python -m tools.emoji_text.vocabulary --model weights/emoji        # writes tokenizer/vocabulary.txt

The model trained on configs/emoji-text.yaml: the 5-vendor emoji set (tools/emoji_text/emoji_set.py) minus the 500
FID images, captioned from the columns name, short_name, keywords ("|"-separated) and category. Its captions are
those of the catalog's emoji: every emoji of the set is drawn by several vendors and no emoji lost all its drawings
to the held-out 500 (2 of the 5 vendors' drawings at most; tools/emoji_text/prompt_fidelity.md), so the texts are
read from the pinned catalog and CLDR packages (emoji_set.CATALOG and KEYWORDS, checked against their integrity,
cached in $DENOISER_CACHE/npm) through the same CaptionSpec the training data used, then kept as the
tokenizer's words (WordHashTokenizer(vocabulary=...)).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from denoiser.data.captions import caption_spec
from denoiser.data.store import cache_root
from denoiser.model.text import WordHashTokenizer
from tools.emoji_text.emoji_set import CATALOG, KEYWORD_SEPARATOR, KEYWORDS, fetch_package, load_catalog

CONFIG = "configs/emoji-text.yaml"


def caption_texts(config: str = CONFIG) -> list[str]:
    """Every caption text of the emoji set under `config`'s caption columns."""
    data = yaml.safe_load(Path(config).read_text())["data"]  # its data.path (the built folder) need not exist here
    spec = caption_spec(data["caption_columns"], data.get("caption_separator", "|"))
    npm = cache_root() / "npm"
    npm.mkdir(parents=True, exist_ok=True)
    emoji = load_catalog(fetch_package(CATALOG, npm), fetch_package(KEYWORDS, npm))
    texts: set[str] = set()
    for e in emoji:
        row = {"name": e.name, "short_name": e.short_name, "keywords": KEYWORD_SEPARATOR.join(e.keywords),
               "category": e.category, "subcategory": e.subcategory}
        texts.update(t for group in spec.candidates([row[c] for c in spec.columns]) for t in group)
    return sorted(texts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=Path("weights/emoji"), help="the text model folder")
    args = p.parse_args()
    folder = args.model / "tokenizer"
    old = WordHashTokenizer.from_pretrained(folder)
    texts = caption_texts()
    tokenizer = WordHashTokenizer(**{k: v for k, v in old.config.items() if not k.startswith("_")}, vocabulary=texts)
    tokenizer.save_pretrained(folder)
    size = (folder / WordHashTokenizer.vocabulary_name).stat().st_size
    print(f"{len(texts)} caption texts -> {len(tokenizer.vocabulary)} words, {folder / WordHashTokenizer.vocabulary_name} "
          f"({size / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
