"""Write the image folder packed by bench/gpu/pack_data.py: python3 unpack_data.py PACK OUT_DIR."""

import json
import sys
from pathlib import Path

from safetensors import safe_open


def main(pack: str, out: str) -> None:
    with safe_open(pack, "pt") as f:
        paths = json.loads(f.metadata()["paths"])
        data, offsets = f.get_tensor("bytes").numpy().tobytes(), f.get_tensor("offsets").tolist()
    for i, rel in enumerate(paths):
        path = Path(out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[offsets[i] : offsets[i + 1]])
    print(f"{out}: {len(paths)} images")


if __name__ == "__main__":
    main(*sys.argv[1:])
