"""The command line: help, sample, attention and evaluate on a model folder made in the test."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image

from denoiser.cli.main import main
from denoiser.folders.model_dir import find_model, load_model
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import cli


@pytest.fixture
def model_dir(tiny_unet, tmp_path):
    return save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "model")


def test_help_lists_subcommands():
    out = cli("--help").stdout
    for sub in ("train", "sample", "attention", "evaluate", "app"):
        assert sub in out


def test_class_label_by_name_or_index(tmp_path, capsys):
    from denoiser import UNet
    from tests.conftest import TINY

    torch.manual_seed(0)
    model = save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), tmp_path / "m", classes=["red", "green", "blue"])
    common = ["sample", "--model", str(model), "--num-images", "2", "--steps", "2", "--scale", "1", "--guidance", "2"]
    assert main([*common, "--out", str(tmp_path / "a.png"), "--class-label", "green"]) == 0
    assert main([*common, "--out", str(tmp_path / "b.png"), "--class-label", "1"]) == 0
    assert Image.open(tmp_path / "a.png").tobytes() == Image.open(tmp_path / "b.png").tobytes()
    assert main([*common, "--out", str(tmp_path / "c.png"), "--class-label", "cyan"]) == 2
    assert "unknown class 'cyan'; this model's classes: red, green, blue" in capsys.readouterr().err


def test_sample_writes_grid_and_trajectory(model_dir, tmp_path, capsys):
    assert main(["sample", "--model", str(model_dir), "--out", str(tmp_path / "s.png"), "--num-images", "4",
                 "--steps", "3", "--scale", "1", "--trajectory", str(tmp_path / "t.png"), "--trajectory-every", "1"]) == 0
    assert Image.open(tmp_path / "s.png").size == (2 * 18 + 2, 2 * 18 + 2)
    assert Image.open(tmp_path / "t.png").size[1] == 2 * 18 + 2  # two rows: x_t over x0
    assert main(["sample", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "x.png")]) == 2
    assert "not a model folder" in capsys.readouterr().err


def test_attention_writes_a_panel(model_dir, tmp_path, capsys):
    assert main(["attention", "--model", str(model_dir), "--pixel", "3,12", "--out", str(tmp_path / "a.png"),
                 "--steps", "2"]) == 0
    assert "4 layers" in capsys.readouterr().out
    assert Image.open(tmp_path / "a.png").width > 200
    assert main(["attention", "--model", str(model_dir), "--pixel", "16,0", "--out", str(tmp_path / "b.png")]) == 2
    assert "outside the 16x16 image" in capsys.readouterr().err


def test_evaluate_prints_json(model_dir, tmp_path, capsys):
    for cls in ("a", "b"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20, 20), (40 * i, 100, 200)).save(tmp_path / "imgs" / cls / f"{i}.png")
    assert main(["evaluate", "--model", str(model_dir), "--data", str(tmp_path / "imgs"), "--num-images", "4",
                 "--num-timesteps", "5"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["num_images"] == 4 and res["num_timesteps"] == 5
    assert len(res["mse_per_timestep"]) == 5
    # the CLI reports what Diffusion.evaluate computes on the same images (sorted ImageFolder order)
    from denoiser.data import DataConfig, load_dataset
    from denoiser.diffusion import Diffusion

    unet, sched = load_model(model_dir)
    x, _ = load_dataset(DataConfig(dataset="folder", path=str(tmp_path / "imgs")), unet.config.sample_size).batch(torch.arange(4))
    direct = Diffusion(sched).evaluate(unet, x, num_timesteps=5)
    assert res["bits_per_dim"] == pytest.approx(direct.bits_per_dim, rel=1e-6)
    assert res["prior_bpd"] + res["diffusion_bpd"] + res["decoder_bpd"] == pytest.approx(res["bits_per_dim"], rel=1e-9)


def test_load_model_upcasts_half_weights(tiny_unet, tmp_path):
    save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "half", dtype=torch.float16)
    unet, _ = load_model(tmp_path / "half")
    assert unet.dtype == torch.float32
    assert tiny_unet.dtype == torch.float32  # the original is untouched


def test_model_names_cannot_leave_the_weights_folder(model_dir):
    root = model_dir.parent
    assert find_model("model", root, paths=False) == model_dir.resolve()
    for bad in ("../model", "/etc", "model/../../x", "missing"):
        with pytest.raises(ValueError, match="unknown model"):
            find_model(bad, root, paths=False)


def test_symlinks_out_of_the_weights_folder_are_neither_listed_nor_opened(model_dir, tmp_path):
    import shutil

    from denoiser.folders.model_dir import list_models

    root = tmp_path / "weights"
    root.mkdir()
    shutil.copytree(model_dir, root / "good")
    (root / "outside").symlink_to(model_dir, target_is_directory=True)  # a folder link leaving the root
    shutil.copytree(model_dir, root / "leaky")
    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    (root / "leaky" / "classes.txt").symlink_to(secret)  # a file link leaving the model folder
    assert list_models(root) == ["good"]
    for name in ("outside", "leaky"):
        with pytest.raises(ValueError, match="unknown model"):
            find_model(name, root, paths=False)
        with pytest.raises(FileNotFoundError, match="unknown model"):  # the command line's lookup by name: the same rule
            find_model(name, root)
    assert find_model("good", root, paths=False) == (root / "good").resolve()


def test_channels_last_model_saves_and_reloads(tiny_unet, tmp_path):
    tiny_unet = tiny_unet.to(memory_format=torch.channels_last)
    save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m")
    x = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(loaded(x, 3).sample, tiny_unet(x, 3).sample, rtol=1e-5, atol=1e-5)


def test_sample_and_restore_take_the_guidance_flags(tmp_path, capsys):
    from denoiser import UNet
    from denoiser.image_io import to_pil
    from denoiser.sampling.guidance import Guidance
    from denoiser.sampling.loop import make_sampler, sample
    from tests.conftest import TINY

    torch.manual_seed(0)
    unet = UNet(**TINY, num_class_embeds=3).eval()
    model = save_pipeline(unet, DDPMScheduler(), tmp_path / "model")
    assert main(["sample", "--model", str(model), "--out", str(tmp_path / "pag.png"), "--num-images", "2", "--steps", "3",
                 "--scale", "1", "--class-label", "1", "--guidance", "2", "--pag-scale", "1.5", "--pag-layers", "mid_attn"]) == 0
    loaded, sched = load_model(model)
    want = sample(loaded, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=1,
                  guidance=Guidance(scale=2.0, pag_scale=1.5, pag_layers=("mid_attn",))).images
    assert Image.open(tmp_path / "pag.png").convert("RGB").tobytes() == to_pil(want).tobytes()
    assert main(["sample", "--model", str(model), "--out", str(tmp_path / "int.png"), "--num-images", "2", "--steps", "3",
                 "--scale", "1", "--class-label", "1", "--guidance", "2", "--guidance-interval", "200", "600"]) == 0
    inside = sample(loaded, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=1,
                    guidance=Guidance(scale=2.0, interval=(200, 600))).images  # guides t = 333 of 666, 333, 0
    assert Image.open(tmp_path / "int.png").convert("RGB").tobytes() == to_pil(inside).tobytes()
    assert (inside - want).abs().max() > 1e-3
    assert main(["sample", "--model", str(model), "--out", str(tmp_path / "x.png"), "--pag-scale", "1",
                 "--pag-layers", "mid"]) == 2
    assert "unknown PAG layer(s) mid" in capsys.readouterr().err
    Image.new("RGB", (20, 20), (250, 0, 0)).save(tmp_path / "in.png")
    Image.new("L", (20, 20), 255).save(tmp_path / "mask.png")
    assert main(["inpaint", "--model", str(model), "--image", str(tmp_path / "in.png"), "--mask", str(tmp_path / "mask.png"),
                 "--out", str(tmp_path / "o.png"), "--steps", "2", "--pag-scale", "2"]) == 0


def test_python_dash_m_denoiser_cli_runs_the_command_line():
    """`python -m denoiser.cli` (the Makefile's build-kernels) failed with an import error after the package moved to
    subpackages, so a fresh `make test` built no kernels; it runs the command line again."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "denoiser.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "build-kernels" in out.stdout and "sample" in out.stdout


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_help_loads_no_torch(argv):
    """`denoiser train --help` took 5.5 s: the train flags' module imported accelerate and the config's torchvision at
    its top, though its comment said the flags load no torch. They are imported when a run starts now."""
    import subprocess
    import sys

    code = ("import sys\nfrom denoiser.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'accelerate', 'diffusers', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]
    assert "--config" in out.stdout or "train" in out.stdout
