"""denoiser/model/attention_capture.py: exact weights rebuilt from the recorded q and k; a capture sees only its thread."""

from __future__ import annotations

import pytest
import torch

from denoiser.model.attention import scaled_dot_product_attention
from denoiser.model.attention_blocks import SpatialSelfAttention
from denoiser.model.attention_capture import capture_attention


def test_capture_rebuilds_exact_weights_and_changes_nothing():
    torch.manual_seed(0)
    block = SpatialSelfAttention(16, num_heads=2, norm_num_groups=4).double()
    x = torch.randn(2, 16, 5, 7, dtype=torch.float64)
    plain = block(x)
    with capture_attention(block) as records:
        captured = block(x)
    assert torch.equal(plain, captured)  # bit-identical
    assert len(records) == 1
    rec = records[0]
    assert rec.size == (5, 7) and rec.num_heads == 2
    # q, k are O(N·d): nothing of size N×N is kept
    assert rec.q.shape == (2, 2, 35, 8) and rec.k.shape == (2, 2, 35, 8)
    h = block.norm(x).flatten(2).transpose(1, 2)
    q, k, v = block.attention.qkv(h).reshape(2, 35, 3, 2, 8).permute(2, 0, 3, 1, 4)
    _, ref_w = scaled_dot_product_attention(q, k, v, return_weights=True)  # (B, h, N, N)
    for y, xq in [(0, 0), (2, 3), (4, 6)]:
        w = rec.weights((y, xq))
        assert w.shape == (2, 2, 5, 7)
        torch.testing.assert_close(w.sum((-2, -1)), torch.ones(2, 2, dtype=torch.float64))
        torch.testing.assert_close(w.flatten(2), ref_w[:, :, y * 7 + xq], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="outside"):
        rec.weights((5, 0))
    assert block.attention._recorder is None  # unhooked on exit


def test_capture_belongs_to_its_own_thread():
    import threading

    from denoiser import UNet
    from tests.conftest import TINY

    torch.manual_seed(0)
    unet = UNet(**TINY).eval()
    x2, x5 = torch.randn(2, 3, 16, 16), torch.randn(5, 3, 16, 16)
    with torch.no_grad(), capture_attention(unet) as alone:
        unet(x2, 10)
    stop, errors = threading.Event(), []

    def other_session():  # sampling-like calls with another batch size, no capture of its own
        try:
            with torch.no_grad():
                while not stop.is_set():
                    unet(x5, 500)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    def capturing(results):
        try:
            for _ in range(5):
                with torch.no_grad(), capture_attention(unet) as recs:
                    unet(x2, 10)
                results.append(recs)
        except Exception as err:  # noqa: BLE001 - a second capture at once used to raise RuntimeError
            errors.append(err)

    first, second = [], []
    threads = [threading.Thread(target=other_session), threading.Thread(target=capturing, args=(first,)),
               threading.Thread(target=capturing, args=(second,))]
    for t in threads:
        t.start()
    threads[1].join()
    threads[2].join()
    stop.set()
    threads[0].join()
    assert not errors
    for recs in first + second:
        assert len(recs) == len(alone)  # only this thread's calls
        for a, b in zip(recs, alone, strict=True):
            assert a.q.shape[0] == 2 and a.name == b.name
            torch.testing.assert_close(a.q, b.q) and torch.testing.assert_close(a.k, b.k)
