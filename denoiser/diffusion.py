"""The DDPM objective (Ho et al. 2020) on diffusers' `DDPMScheduler`, and its held-out evaluation.

Training: x_t = √ᾱ_t x₀ + √(1-ᾱ_t) ε for a uniform t, and the UNet regresses ε (or v, Salimans & Ho
2022) with an MSE, optionally weighted by min-SNR-γ (Hang et al. 2023).

Evaluation: the per-timestep denoising MSE and the variational bound in bits per dimension,

    L = L_T (prior) + Σ_{t=1}^{T-1} KL(q(x_{t-1} | x_t, x₀) ‖ p(x_{t-1} | x_t)) + L_0 (decoder),

with Ho et al.'s discretized Gaussian decoder over the 256 pixel values at t = 0 and the scheduler's
fixed variance. It costs one UNet forward pass per image per evaluated timestep: T = 1000 passes
per image for the full bound. `num_timesteps` evaluates a subset instead, log-spaced so that it is
dense at small t, where the KL terms are large and change fast, and weights each evaluated t by the
number of timesteps it stands for (a midpoint rule over t; an estimate); `num_images` bounds the
image count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from diffusers import DDPMScheduler

__all__ = ["Diffusion", "DiffusionConfig", "make_noise_schedule", "EvalResult"]


@dataclass
class DiffusionConfig:
    """The `diffusion:` section of a run's config: the noise schedule and what the UNet predicts."""

    num_train_timesteps: int = 1000  # T
    beta_schedule: str = "linear"  # "linear" (Ho et al.) or "cosine" (Nichol & Dhariwal)
    beta_start: float = 0.0001  # linear schedule's first beta
    beta_end: float = 0.02  # linear schedule's last beta
    prediction_type: str = "epsilon"  # "epsilon" or "v_prediction"


def make_noise_schedule(cfg: DiffusionConfig) -> DDPMScheduler:
    """The DDPM training scheduler for a diffusion config (clip x₀ to [-1, 1] when sampling).

    Samplers built from it (`denoiser.sampling.loop.make_sampler`, diffusers' pipelines) visit "trailing" timesteps:
    T-1, T-1-T/n, ..., so few-step sampling starts from pure noise (Lin et al. 2024); on weights/cifar10 it
    scores a lower FID than "leading" (980, 960, ..., 0): measured in weights/cifar10/README.md."""
    return DDPMScheduler(
        num_train_timesteps=cfg.num_train_timesteps,
        beta_start=cfg.beta_start,
        beta_end=cfg.beta_end,
        beta_schedule={"linear": "linear", "cosine": "squaredcos_cap_v2"}[cfg.beta_schedule],
        prediction_type=cfg.prediction_type,
        variance_type="fixed_small",
        clip_sample=True,
        timestep_spacing="trailing",
    )


@dataclass
class EvalResult:
    bits_per_dim: float  # the variational bound, bits per dimension
    prior_bpd: float  # L_T
    decoder_bpd: float  # L_0, the discretized Gaussian decoder
    diffusion_bpd: float  # Σ KL terms (estimated when strided)
    mse_per_timestep: dict[int, float]  # MSE of the predicted noise ε at each evaluated t (v models: the ε they imply)
    mse_mean: float  # mean MSE over t = 0..T-1 (each evaluated t weighted by the timesteps it stands for)
    num_images: int
    num_timesteps: int  # timesteps evaluated (T for the full bound)

    def mse_at(self, t: int) -> tuple[int, float]:
        """(evaluated timestep nearest to t, its MSE)."""
        nearest = min(self.mse_per_timestep, key=lambda s: abs(s - t))
        return nearest, self.mse_per_timestep[nearest]

    def to_dict(self) -> dict:
        """JSON-ready: every field, timestep keys as strings."""
        out = dict(self.__dict__)
        out["mse_per_timestep"] = {str(k): v for k, v in self.mse_per_timestep.items()}
        return out


class Diffusion:
    """Noising, the training loss and the bound, all from one `DDPMScheduler`'s ᾱ table."""

    def __init__(self, noise_schedule: DDPMScheduler) -> None:
        self.noise_schedule = noise_schedule  # the training DDPMScheduler: betas and ᾱ_t (sampling uses a sampler)
        self.T = noise_schedule.config.num_train_timesteps
        self.prediction_type = noise_schedule.config.prediction_type
        self.alphas_cumprod = noise_schedule.alphas_cumprod.double()  # (T,)
        self.betas = noise_schedule.betas.double()  # (T,)

    @classmethod
    def from_config(cls, cfg: DiffusionConfig) -> Diffusion:
        return cls(make_noise_schedule(cfg))

    def _abar(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        a = self.alphas_cumprod.to(like.device)[t].to(like.dtype)
        return a.reshape(-1, *([1] * (like.ndim - 1)))  # (B, 1, 1, 1) broadcast over pixels

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self._abar(t, x0)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise

    def target(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.prediction_type == "epsilon":
            return noise
        a = self._abar(t, x0)
        return a.sqrt() * noise - (1 - a).sqrt() * x0  # v

    def predict_x0(self, x_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self._abar(t, x_t)
        if self.prediction_type == "epsilon":
            return (x_t - (1 - a).sqrt() * model_output) / a.sqrt()
        return a.sqrt() * x_t - (1 - a).sqrt() * model_output

    def sigma_to_timestep(self, sigma: float) -> int:
        """The timestep whose noise-to-signal ratio √((1 − ᾱ_t)/ᾱ_t) is nearest to 2σ: an image with Gaussian
        noise of std σ on the [0, 1] pixel scale (2σ on the model's [-1, 1]), scaled by √ᾱ_t, is an x_t there."""
        if not sigma > 0:
            raise ValueError(f"sigma must be positive (noise std on the [0, 1] pixel scale), got {sigma}")
        ratio = ((1 - self.alphas_cumprod) / self.alphas_cumprod).sqrt()  # (T,)
        return int((ratio - 2 * sigma).abs().argmin())

    def sample_timesteps(self, batch: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
        return torch.randint(0, self.T, (batch,), generator=generator, device=device)

    def training_loss(
        self,
        unet: torch.nn.Module,
        x0: torch.Tensor,
        class_labels: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        timesteps: torch.Tensor | None = None,
        snr_gamma: float | None = None,
        unet_kwargs: dict | None = None,
    ) -> torch.Tensor:
        """The mean (optionally min-SNR-γ weighted) MSE between the UNet output and its target.
        unet_kwargs: passed on to the UNet call (a text model's prompt tokens, denoiser.model.text.PromptedUNet).

        `noise` and `timesteps` may be given (the training loop draws them for the global batch so
        that any number of processes sees the same numbers); otherwise they come from `generator`.
        """
        B = x0.shape[0]
        if noise is None:
            noise = torch.randn(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
        if timesteps is None:
            timesteps = self.sample_timesteps(B, generator, x0.device)
        x_t = self.add_noise(x0, noise, timesteps)
        pred = unet(x_t, timesteps, class_labels=class_labels, **(unet_kwargs or {})).sample
        per_image = (pred.float() - self.target(x0, noise, timesteps).float()).pow(2).flatten(1).mean(1)  # (B,)
        if snr_gamma is not None:
            snr = self.snr(timesteps).to(per_image)
            weight = snr.clamp(max=snr_gamma) / (snr if self.prediction_type == "epsilon" else snr + 1)
            per_image = per_image * weight
        return per_image.mean()

    def snr(self, t: torch.Tensor) -> torch.Tensor:
        a = self.alphas_cumprod.to(t.device)[t]
        return a / (1 - a)

    # ----------------------------------------------------------------------------------------
    # The variational bound
    # ----------------------------------------------------------------------------------------

    def _posterior(self, x0: torch.Tensor, x_t: torch.Tensor, t: int) -> tuple[torch.Tensor, float]:
        """Mean and log-variance β̃_t of the true posterior q(x_{t-1} | x_t, x₀) (for t = 0 the log-variance
        is clipped). The model's reverse step uses this mean with x₀ predicted, and `_model_logvar(t)`."""
        abar, beta = self.alphas_cumprod[t], self.betas[t]
        abar_prev = self.alphas_cumprod[t - 1] if t > 0 else torch.tensor(1.0, dtype=torch.float64)
        coef_x0 = beta * abar_prev.sqrt() / (1 - abar)
        coef_xt = (1 - abar_prev) * (1 - beta).sqrt() / (1 - abar)
        var = beta * (1 - abar_prev) / (1 - abar)
        if t == 0:  # β̃_0 = 0: use β̃_1, as Ho et al.'s decoder does
            var = self.betas[1] * (1 - self.alphas_cumprod[0]) / (1 - self.alphas_cumprod[1])
        return coef_x0 * x0 + coef_xt * x_t, float(var.log())

    def _model_logvar(self, t: int, posterior_logvar: float) -> float:
        """The reverse process's fixed variance: β̃_t (fixed_small) or β_t (fixed_large; not at t = 0)."""
        if self.noise_schedule.config.variance_type == "fixed_large" and t > 0:
            return float(self.betas[t].log())
        return posterior_logvar

    def predict_eps(self, x_t: torch.Tensor, model_output: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The noise a model output implies: itself for ε-prediction, √ᾱ v + √(1-ᾱ) x_t for v-prediction."""
        if self.prediction_type == "epsilon":
            return model_output
        a = self._abar(t, x_t)
        return a.sqrt() * model_output + (1 - a).sqrt() * x_t

    @torch.no_grad()
    def evaluate(
        self,
        unet: torch.nn.Module,
        images: torch.Tensor,
        class_labels: torch.Tensor | None = None,
        batch_size: int = 64,
        num_timesteps: int | None = None,
        seed: int = 0,
        progress=None,
        unet_kwargs: dict[str, torch.Tensor] | None = None,
    ) -> EvalResult:
        """The bound and per-timestep MSE on `images` (N, C, H, W) in [-1, 1]; see the module docstring.
        unet_kwargs: per-image tensors (N, ...) the UNet also takes, sliced with the images: a text model's
        encoder_hidden_states and encoder_attention_mask, so the bound is the one given each image's prompt."""
        if images.ndim != 4:
            raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
        for name, value in (unet_kwargs or {}).items():
            if value.shape[0] != images.shape[0]:
                raise ValueError(f"unet_kwargs[{name!r}] has {value.shape[0]} rows for {images.shape[0]} images: one per image")
        device = next(unet.parameters()).device
        N, D = images.shape[0], images[0].numel()
        steps, weights = _timestep_grid(self.T, num_timesteps)
        gen = torch.Generator().manual_seed(seed)
        noise_all = torch.randn(images.shape, generator=gen)  # one noise per image, reused over t

        nats = torch.zeros(N, dtype=torch.float64)
        decoder = torch.zeros(N, dtype=torch.float64)
        mse = {}
        x0_all = images.double()
        aT = self.alphas_cumprod[-1]
        prior = _normal_kl(aT.sqrt() * x0_all, (1 - aT).log(), torch.zeros(()), torch.zeros(())).flatten(1).sum(1)
        iterator = progress(steps) if progress else steps
        for t in iterator:
            errs = []
            for s in range(0, N, batch_size):
                x0 = x0_all[s : s + batch_size]
                eps = noise_all[s : s + batch_size].double()
                tt = torch.full((x0.shape[0],), t, dtype=torch.long)
                x_t = self.add_noise(x0, eps, tt)
                labels = None if class_labels is None else class_labels[s : s + batch_size].to(device)
                extra = {k: v[s : s + batch_size].to(device) for k, v in (unet_kwargs or {}).items()}
                out = unet(x_t.float().to(device), tt.to(device), class_labels=labels, **extra).sample.double().cpu()
                errs.append((self.predict_eps(x_t, out, tt) - eps).pow(2).flatten(1).mean(1))  # ε-MSE for ε and v models
                x0_pred = self.predict_x0(x_t, out, tt).clamp(-1, 1)
                model_mean, logvar = self._posterior(x0_pred, x_t, t)
                logvar = self._model_logvar(t, logvar)
                if t == 0:
                    ll = _discretized_gaussian_log_likelihood(x0, model_mean, 0.5 * logvar)
                    decoder[s : s + batch_size] = -ll.flatten(1).sum(1)
                else:
                    true_mean, true_logvar = self._posterior(x0, x_t, t)
                    kl = _normal_kl(true_mean, torch.tensor(true_logvar), model_mean, torch.tensor(logvar))
                    nats[s : s + batch_size] += kl.flatten(1).sum(1) * weights[t]
            mse[t] = float(torch.cat(errs).mean())
        to_bpd = 1.0 / (D * math.log(2.0))
        total = (prior + nats + decoder) * to_bpd
        return EvalResult(
            bits_per_dim=float(total.mean()),
            prior_bpd=float(prior.mean() * to_bpd),
            decoder_bpd=float(decoder.mean() * to_bpd),
            diffusion_bpd=float(nats.mean() * to_bpd),
            mse_per_timestep=mse,
            mse_mean=sum(mse[t] * weights[t] for t in steps) / sum(weights[t] for t in steps),
            num_images=N,
            num_timesteps=len(steps),
        )


def _timestep_grid(T: int, num_timesteps: int | None) -> tuple[list[int], dict[int, float]]:
    """Timesteps to evaluate and the weight of each: all T with weight 1, or t = 0 plus a log-spaced
    subset of 1..T-1 whose weights are their midpoint cells (they sum to T - 1)."""
    if num_timesteps is None or num_timesteps >= T:
        return list(range(T)), dict.fromkeys(range(T), 1.0)
    if num_timesteps < 2:
        raise ValueError(f"num_timesteps must be at least 2, got {num_timesteps}")
    k = num_timesteps - 1
    grid = torch.logspace(0, math.log10(T - 1), k, dtype=torch.float64).round().long().unique().tolist()
    extra = [t for t in range(1, T) if t not in grid]
    while len(grid) < k and extra:  # rounding merged some small t: fill with the smallest missing ones
        grid.append(extra.pop(0))
    grid = sorted(grid)
    edges = [0.5] + [(a + b) / 2 for a, b in zip(grid, grid[1:])] + [T - 0.5]  # cells tile t = 1..T-1
    weights = {0: 1.0} | {t: edges[i + 1] - edges[i] for i, t in enumerate(grid)}
    return [0] + grid, weights


def _normal_kl(mean1, logvar1, mean2, logvar2) -> torch.Tensor:
    """KL(N(mean1, e^logvar1) ‖ N(mean2, e^logvar2)), elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _discretized_gaussian_log_likelihood(x: torch.Tensor, mean: torch.Tensor, log_scale: float) -> torch.Tensor:
    """log P(x) for x on the 256-value grid in [-1, 1] under N(mean, e^{2·log_scale}) integrated over
    each value's bin of width 2/255; the edge bins extend to ±∞ (Ho et al. 2020, eq. 13)."""
    inv_std = math.exp(-log_scale)
    upper = (x - mean + 1.0 / 255.0) * inv_std
    lower = (x - mean - 1.0 / 255.0) * inv_std
    log_cdf_upper = torch.special.log_ndtr(upper)  # log P(X < upper), for the x = -1 bin
    log_sf_lower = torch.special.log_ndtr(-lower)  # log P(X > lower), for the x = +1 bin
    log_mass = torch.log((torch.special.ndtr(upper) - torch.special.ndtr(lower)).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_upper, torch.where(x > 0.999, log_sf_lower, log_mass))
