"""Write the image folder packed by tools/gpu/pack_data.py: python3 unpack_data.py PACK OUT_DIR.
Its metadata.csv too, when the pack carries one (packs made before that have only the images)."""

import json
import sys
from pathlib import Path

from safetensors import safe_open


def main(pack: str, out: str) -> None:
    with safe_open(pack, "pt") as f:
        paths, meta = json.loads(f.metadata()["paths"]), f.metadata().get("metadata.csv")
        data, offsets = f.get_tensor("bytes").numpy().tobytes(), f.get_tensor("offsets").tolist()
    for i, rel in enumerate(paths):
        path = Path(out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[offsets[i] : offsets[i + 1]])
    if meta is not None:
        (Path(out) / "metadata.csv").write_text(meta, encoding="utf-8", newline="")
    print(f"{out}: {len(paths)} images" + ("" if meta is None else " and metadata.csv"))


if __name__ == "__main__":
    main(*sys.argv[1:])
