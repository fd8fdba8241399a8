"""Training a text model (model.cross_attention_dim): the UNet and its text encoder learn together from a folder's
captions, EMA covers both, the model folder gets text_encoder/ and tokenizer/, and a resumed run ends with the
uninterrupted run's weights; --init-from turns a class model into a text model that starts as its "no class" self."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler, DiffusionPipeline
from safetensors.torch import load_file

import denoiser  # noqa: F401  (registers DenoiserPipeline with DiffusionPipeline)
from denoiser.data import DataConfig, open_training_data
from denoiser.model.text import HashTextEncoder, PromptedUNet, WordHashTokenizer, encode_prompts, words
from denoiser.model.unet import UNet
from denoiser.sampling.pipeline import DenoiserPipeline, save_pipeline
from denoiser.train.config import load_config
from denoiser.train.loop import train
from tests.conftest import TRAIN_CONFIG, write_config
from tests.data.test_captions import emoji_folder, write_shards

D = 16
NAMES = ["red apple", "green pear", "yellow lemon", "cat face", "dog face", "blue whale", "hot tea", "red heart"]
MODEL = {"num_class_embeds": None, "cross_attention_dim": D}
TEXT = {"hidden_size": D, "num_buckets": 256, "num_layers": 1, "num_heads": 2, "max_length": 8}


def captioned_folder(root):
    """16 small images in two class folders, each with a name and keywords in metadata.csv (the emoji set's layout)."""
    rows = [(f"{'food' if i % 2 else 'animals'}/{i:02d}.png", NAMES[i % 8] + (" again" if i >= 8 else ""), "",
             "thing|round" if i % 3 else "", "Misc") for i in range(16)]
    return emoji_folder(root, rows)


def text_config(path, root, **train):
    return write_config(path, model=MODEL, text=TEXT,
                        data={"dataset": "folder", "path": str(root), "caption_columns": ["name", "keywords"], "val_size": 0},
                        train={"max_steps": 4, "checkpoint_every": 2, "report_to": None, **train})


def reset_accelerate():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="module")
def single_thread():
    """Runs in this process on one thread (a subprocess each would spend most of the test importing; a tiny model
    only loses to thread hand-offs); Accelerate's process-wide state is reset for the tests that follow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    reset_accelerate()


@pytest.fixture(scope="module")
def straight(tmp_path_factory, single_thread):
    """A 4-step text run, uninterrupted: (run folder, its config file, the data folder)."""
    tmp = tmp_path_factory.mktemp("text-run")
    root = captioned_folder(tmp / "data")
    cfg = text_config(tmp / "c.yaml", root)
    train(load_config(cfg), tmp / "run")
    reset_accelerate()
    return tmp / "run", cfg, root


def _ckpt(run, step: int, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"checkpoint-{step:08d}" / name))


def test_a_text_run_exports_its_text_encoder_and_tokenizer(straight):
    run, cfg_file, _ = straight
    cfg = load_config(cfg_file)
    model = run / "model"
    for name in ("unet/config.json", "text_encoder/config.json", "text_encoder/diffusion_pytorch_model.safetensors",
                 f"tokenizer/{WordHashTokenizer.config_name}"):
        assert (model / name).is_file(), name
    pipe = DiffusionPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, DenoiserPipeline) and pipe.unet.config.cross_attention_dim == D
    assert {k: pipe.tokenizer.config[k] for k in cfg.text.tokenizer_args()} == cfg.text.tokenizer_args()
    assert {k: pipe.text_encoder.config[k] for k in cfg.text.encoder_args()} == cfg.text.encoder_args()
    images = pipe(prompt=["red apple", ""], num_inference_steps=2, output_type="pt").images
    assert images.shape == (2, 3, 8, 8) and torch.isfinite(images).all()


def test_a_text_run_exports_the_words_of_its_captions(straight):
    run, _, _ = straight
    tokenizer = WordHashTokenizer.from_pretrained(run / "model" / "tokenizer")
    assert tokenizer.vocabulary == {w for text in NAMES for w in words(text)} | {"again", "thing", "round"}
    assert tokenizer.unseen("a red whale with 日本") == ["a", "with", "日本"]


@pytest.mark.parametrize("streaming", [False, True])
def test_the_caption_words_leave_the_validation_images_out(tmp_path, streaming):
    cfg = DataConfig(dataset="webdataset", path=write_shards(tmp_path / "shards"), caption_columns=["txt"], val_size=3,
                     streaming=streaming)  # 12 items captioned "thing i", item 5 without a caption
    data = open_training_data(cfg, 8, seed=0, batch_size=4)
    data.close()
    held = {t for groups in data.validation.candidates[torch.arange(3)] for g in groups for t in g}
    assert held and sorted(data.caption_texts()) == sorted({f"thing {i}" for i in range(12) if i != 5} - held)


def test_gradients_reach_the_text_encoder_and_ema_covers_it(straight):
    run, cfg_file, _ = straight
    cfg = load_config(cfg_file)
    early, late = _ckpt(run, 2), _ckpt(run, 4)
    text_keys = [k for k in late if k.startswith("text_encoder.")]
    assert text_keys and any(k.startswith("unet.") for k in late)  # the pair is checkpointed as one model
    for key in ("text_encoder.embed.weight", "text_encoder.layers.layers.0.linear1.weight", "text_encoder.norm.weight"):
        assert not torch.equal(early[key], late[key]), key  # trained: gradients flow through cross-attention
    # the export is the EMA of both: parameter i of PromptedUNet is entry i of ema.safetensors
    ema = _ckpt(run, 4, "ema.safetensors")
    with torch.device("meta"):
        names = [n for n, _ in PromptedUNet(UNet(**cfg.model), HashTextEncoder(**cfg.text.encoder_args())).named_parameters()]
    assert len(names) == len(ema)
    exported = load_file(str(run / "model" / "text_encoder" / "diffusion_pytorch_model.safetensors"))
    unet = load_file(str(run / "model" / "unet" / "diffusion_pytorch_model.safetensors"))
    for i, name in enumerate(names):
        part, key = name.split(".", 1)
        assert torch.equal((exported if part == "text_encoder" else unet)[key], ema[str(i)]), name
    assert not torch.equal(exported["embed.weight"], late["text_encoder.embed.weight"])  # EMA, not the raw weights


def test_resume_continues_a_text_run_exactly(straight, tmp_path):
    run, cfg_file, _ = straight
    split = tmp_path / "split"
    train(load_config(cfg_file, ["train.max_steps=2"]), split)  # stops at step 2, as a killed run would
    reset_accelerate()
    train(load_config(cfg_file), split, resume="latest")
    reset_accelerate()
    for name in ("model.safetensors", "ema.safetensors"):
        a, b = _ckpt(run, 4, name), _ckpt(split, 4, name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    for part in ("unet", "text_encoder"):
        a = load_file(str(run / "model" / part / "diffusion_pytorch_model.safetensors"))
        b = load_file(str(split / "model" / part / "diffusion_pytorch_model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), part
    steps = [int(line.split(",")[0]) for line in (split / "loss.csv").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_init_from_a_class_model_starts_a_text_model_at_its_no_class_outputs(straight, tmp_path):
    _, cfg_file, root = straight
    arch = {**TRAIN_CONFIG["model"], "num_class_embeds": 2}  # the text run's architecture, without cross-attention
    torch.manual_seed(0)
    old = UNet(**arch).eval()
    with torch.no_grad():  # a trained table: the "no class" row is not zero
        torch.nn.init.normal_(old.class_embed.weight)
    folder = save_pipeline(old, DDPMScheduler(), tmp_path / "class-model")
    # one step at LR 0 (the first warm-up step): the exported model is where the run started
    cfg = load_config(text_config(tmp_path / "c.yaml", root, max_steps=1, checkpoint_every=1))
    model = train(cfg, tmp_path / "run", init_from=str(folder))
    reset_accelerate()
    pipe = DiffusionPipeline.from_pretrained(model)
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([40, 900])
    with torch.no_grad():
        want = old(x, t, class_labels=torch.tensor([2, 2])).sample  # the "no class" row
        for prompts in (["", ""], ["red apple", "hot tea"]):  # the cross-attention's output projections start at zero
            states, mask = encode_prompts(pipe.tokenizer, pipe.text_encoder, prompts)
            got = pipe.unet(x, t, encoder_hidden_states=states, encoder_attention_mask=mask).sample
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(old(x, t, class_labels=torch.tensor([0, 0])).sample, want, rtol=1e-3, atol=1e-4)


def test_the_best_model_of_a_text_run_has_its_words_and_its_fid_samples_the_validation_captions(tmp_path, single_thread,
                                                                                                 monkeypatch):
    """train.keep_best on a text model: its FID sampled with no text (the folder's text encoder was looked up in a
    folder there is none of) and best-model/ was saved without text_encoder/ and tokenizer/. Now best-model/ loads as
    model/ does, and the FID's images are of the validation images' own captions."""
    import denoiser.evaluate.fid
    import denoiser.sampling.plan
    from denoiser.folders.model_dir import load
    from denoiser.train import outputs as train_outputs

    root = captioned_folder(tmp_path / "data")
    reference = tmp_path / "reference.safetensors"
    reference.write_bytes(b"")  # never read: the statistics and the score are stubbed (no Inception here)
    cfg = load_config(text_config(tmp_path / "c.yaml", root, fid_every=2, fid_samples=4, sample_steps=2, keep_best=True,
                                  fid_reference=str(reference)))
    cfg.data.val_size = 3
    asked, scores = [], iter([2.0, 1.0, 3.0])
    resolve = denoiser.sampling.plan.resolve

    def recording_resolve(request, *args, **kwargs):
        asked.append(request.prompts)
        return resolve(request, *args, **kwargs)

    monkeypatch.setattr(denoiser.sampling.plan, "resolve", recording_resolve)
    monkeypatch.setattr(train_outputs, "_inception", lambda device: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "reference_statistics", lambda path: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "fid_of_images", lambda images, ref, extractor: next(scores))
    try:
        train(cfg, tmp_path / "run")
    finally:
        reset_accelerate()
    data = open_training_data(cfg.data, cfg.model["sample_size"], seed=cfg.train.seed, batch_size=4)
    captions = train_outputs.validation_captions(data.validation)
    assert len(captions) == 3 and all(captions)
    assert asked and all(p == [captions[k % 3] for k in range(4)] for p in asked)
    best = load(tmp_path / "run" / "best-model")
    assert best.text is not None and best.text.tokenizer.vocabulary == load(tmp_path / "run" / "model").text.tokenizer.vocabulary
    assert (tmp_path / "run" / "best-model" / "fid.json").is_file()
