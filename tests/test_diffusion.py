"""The DDPM objective against diffusers' scheduler, and the bound on oracle and blind models."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.unets.unet_2d import UNet2DOutput

from denoiser.diffusion import Diffusion, DiffusionConfig, _discretized_gaussian_log_likelihood


@pytest.fixture
def diffusion():
    return Diffusion.from_config(DiffusionConfig())


def test_schedule_is_ho_et_al(diffusion):
    sched = diffusion.noise_schedule
    assert sched.config.num_train_timesteps == 1000
    torch.testing.assert_close(sched.betas[[0, -1]], torch.tensor([1e-4, 0.02]))
    cosine = Diffusion.from_config(DiffusionConfig(beta_schedule="cosine")).noise_schedule
    assert cosine.config.beta_schedule == "squaredcos_cap_v2"


def test_noising_and_targets_match_diffusers(diffusion):
    x0, noise = torch.randn(4, 3, 8, 8), torch.randn(4, 3, 8, 8)
    t = torch.tensor([0, 10, 500, 999])
    torch.testing.assert_close(diffusion.add_noise(x0, noise, t), diffusion.noise_schedule.add_noise(x0, noise, t))
    v = Diffusion.from_config(DiffusionConfig(prediction_type="v_prediction"))
    torch.testing.assert_close(v.target(x0, noise, t), v.noise_schedule.get_velocity(x0, noise, t))
    # predict_x0 inverts the noising for the true target, for both parameterisations
    for d in (diffusion, v):
        x_t = d.add_noise(x0, noise, t)
        torch.testing.assert_close(d.predict_x0(x_t, d.target(x0, noise, t), t), x0, rtol=1e-3, atol=1e-3)


class Oracle(torch.nn.Module):
    """Knows x₀, so it predicts the exact noise: the bound's diffusion terms must vanish."""

    def __init__(self, diffusion, x0):
        super().__init__()
        self.d, self.x0 = diffusion, x0
        self.w = torch.nn.Parameter(torch.zeros(()))  # evaluate() reads the device from a parameter

    def forward(self, x_t, t, class_labels=None):
        a = self.d.alphas_cumprod[t].reshape(-1, 1, 1, 1).to(x_t.dtype)
        x0 = self.x0[: x_t.shape[0]].to(x_t.dtype)
        return UNet2DOutput(sample=(x_t - a.sqrt() * x0) / (1 - a).sqrt())


class Blind(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x_t, t, class_labels=None):
        return UNet2DOutput(sample=torch.zeros_like(x_t))


def test_training_loss_is_mse_to_noise(diffusion):
    x0 = torch.rand(5, 3, 4, 4) * 2 - 1
    noise, t = torch.randn_like(x0), torch.randint(0, 1000, (5,))
    loss = diffusion.training_loss(Blind(), x0, noise=noise, timesteps=t)
    torch.testing.assert_close(loss, noise.pow(2).mean())
    oracle = diffusion.training_loss(Oracle(diffusion, x0), x0, noise=noise, timesteps=t)
    assert oracle < 1e-8
    # min-SNR-γ weights each image by min(snr, γ) / snr
    weighted = diffusion.training_loss(Blind(), x0, noise=noise, timesteps=t, snr_gamma=5.0)
    snr = diffusion.snr(t).float()
    expected = (noise.pow(2).flatten(1).mean(1) * snr.clamp(max=5.0) / snr).mean()
    torch.testing.assert_close(weighted, expected)


def test_decoder_is_a_distribution_over_256_values():
    grid = torch.linspace(-1, 1, 256, dtype=torch.float64)
    for mean, log_scale in [(0.0, -3.0), (0.9, -5.0), (-1.0, -1.0), (0.3, 0.5)]:
        ll = _discretized_gaussian_log_likelihood(grid, torch.full_like(grid, mean), log_scale)
        torch.testing.assert_close(ll.exp().sum(), torch.tensor(1.0, dtype=torch.float64))


def test_bound_for_oracle_is_decoder_only_and_blind_is_worse(diffusion):
    x0 = (torch.randint(0, 256, (3, 3, 4, 4)).double() / 127.5 - 1).float()
    oracle = diffusion.evaluate(Oracle(diffusion, x0), x0, batch_size=3, num_timesteps=50)
    assert oracle.num_timesteps == 50 and oracle.num_images == 3
    assert oracle.diffusion_bpd < 1e-3 and oracle.prior_bpd < 1e-3  # fp32 model outputs
    assert 0.5 < oracle.decoder_bpd < 3.0
    assert max(oracle.mse_per_timestep.values()) < 1e-8
    blind = diffusion.evaluate(Blind(), x0, num_timesteps=50)
    assert blind.bits_per_dim > oracle.bits_per_dim + 1
    assert 0.5 < blind.mse_mean < 1.5  # predicting zero noise: MSE ≈ E[ε²] = 1


def test_full_bound_uses_every_timestep(diffusion):
    x0 = torch.zeros(1, 3, 2, 2)
    res = diffusion.evaluate(Blind(), x0, batch_size=1)
    assert res.num_timesteps == 1000 and len(res.mse_per_timestep) == 1000


def test_fixed_large_bound_compares_the_true_posterior_variance():
    # An oracle predicts x₀ exactly, so each KL term is between N(μ, β̃_t) (the true posterior) and
    # N(μ, β_t) (the model's fixed_large variance): 0.5 (β̃/β − 1 − log(β̃/β)) nats per dimension.
    cfg = DiffusionConfig(num_train_timesteps=100)
    d = Diffusion.from_config(cfg)
    d.noise_schedule.register_to_config(variance_type="fixed_large")
    x0 = (torch.randint(0, 256, (2, 3, 4, 4)).double() / 127.5 - 1).float()
    res = d.evaluate(Oracle(d, x0), x0, batch_size=2)
    beta, abar = d.betas[1:], d.alphas_cumprod
    tilde = d.betas[1:] * (1 - abar[:-1]) / (1 - abar[1:])
    expected = (0.5 * (tilde / beta - 1 - (tilde / beta).log())).sum() / torch.log(torch.tensor(2.0, dtype=torch.float64))
    assert res.diffusion_bpd == pytest.approx(float(expected), rel=1e-3)
    assert res.diffusion_bpd > 0.1
    assert Diffusion.from_config(cfg).evaluate(Oracle(d, x0), x0).diffusion_bpd < 1e-3  # fixed_small: exact


class VOracle(Oracle):
    def forward(self, x_t, t, class_labels=None):
        a = self.d.alphas_cumprod[t].reshape(-1, 1, 1, 1).to(x_t.dtype)
        x0 = self.x0[: x_t.shape[0]].to(x_t.dtype)
        eps = (x_t - a.sqrt() * x0) / (1 - a).sqrt()
        return UNet2DOutput(sample=a.sqrt() * eps - (1 - a).sqrt() * x0)


def test_mse_is_of_the_noise_for_v_prediction_models_too():
    d = Diffusion.from_config(DiffusionConfig(num_train_timesteps=100, prediction_type="v_prediction"))
    x0 = (torch.randint(0, 256, (2, 3, 4, 4)).double() / 127.5 - 1).float()
    assert max(d.evaluate(VOracle(d, x0), x0).mse_per_timestep.values()) < 1e-8
    # a v model answering 0 implies ε = √(1-ᾱ) x_t: its ε-MSE, not its v-MSE, is reported
    blind = d.evaluate(Blind(), x0, num_timesteps=10)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)).double()
    t = max(blind.mse_per_timestep)
    x_t = d.add_noise(x0.double(), noise, torch.full((2,), t))
    implied = (1 - d.alphas_cumprod[t]).sqrt() * x_t
    assert blind.mse_per_timestep[t] == pytest.approx(float((implied - noise).pow(2).mean()), rel=1e-6)


def test_log_spaced_estimate_is_close_to_the_full_bound():
    from denoiser import UNet
    from tests.conftest import TINY

    diffusion = Diffusion.from_config(DiffusionConfig(num_train_timesteps=100))  # T = 100 keeps the full bound cheap
    torch.manual_seed(0)
    unet = UNet(**{**TINY, "sample_size": 8}).eval()
    x0 = (torch.randint(0, 256, (2, 3, 8, 8)).float() / 127.5 - 1)
    full = diffusion.evaluate(unet, x0)
    estimate = diffusion.evaluate(unet, x0, num_timesteps=30)
    assert estimate.num_timesteps == 30
    assert abs(estimate.bits_per_dim - full.bits_per_dim) < 0.02 * full.bits_per_dim
    assert abs(estimate.mse_mean - full.mse_mean) < 0.02 * full.mse_mean
