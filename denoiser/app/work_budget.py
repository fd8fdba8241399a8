"""The app's work budget: what one request may cost, counted by one rule for the note under the sliders and for
the refusal of a request over it (images x steps x the model's UNet passes, guidance interval and guide included)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from denoiser.sampling.guidance import Guidance
from denoiser.sampling.plan import Plan

__all__ = ["WORK_BUDGET", "Work", "work_budget", "model_cost", "work_of", "plan_work"]

# Work units: images × UNet calls × model_cost. The default admits the app's defaults on every shipped
# model many times over (cifar10, 8 images DDIM-50: 2,700) and caps one request at about a minute of
# CPU sampling on 2 cores (e.g. cifar10: 64 images x 70 steps, or 8 images x 550).
WORK_BUDGET = 30_000


def work_budget() -> float:
    """The work units one request may use: DENOISER_WORK_BUDGET, else WORK_BUDGET."""
    return float(os.environ.get("DENOISER_WORK_BUDGET", WORK_BUDGET))


def model_cost(unet) -> float:
    """Relative cost of one image through one UNet call: parameters (millions) × pixels / 32²."""
    params = sum(p.numel() for p in unet.parameters()) / 1e6
    return params * unet.config.sample_size**2 / 32**2


@dataclass(frozen=True)
class Work:
    """A request's work against the server's budget, and its verdict: what the page's note shows and what a
    request over the budget is refused with."""

    num_images: int  # images (tiles for a photo denoised in tiles)
    steps: int  # sampling steps
    per_step: float  # work units of one image's step: the model's cost × its UNet passes (work_of)
    budget: float  # work_budget() when counted
    guidance: Guidance = field(default_factory=Guidance)  # the guidance counted

    @property
    def units(self) -> float:
        return self.num_images * self.steps * self.per_step

    @property
    def over(self) -> bool:
        return self.units > self.budget

    @property
    def max_steps(self) -> int:
        """The most steps within the budget with this many images (at least 1)."""
        return max(1, int(self.budget // (self.num_images * self.per_step)))

    @property
    def max_images(self) -> int:
        """The most images within the budget with this many steps (at least 1)."""
        return max(1, int(self.budget // (self.steps * self.per_step)))

    def check(self) -> None:
        """Refuse, before any work, a request over the budget: what it costs and what would fit."""
        if self.over:
            raise ValueError(
                f"{self.num_images} images x {self.steps} steps ({self.guidance.describe()}) is {self.units:,.0f} work "
                f"units for this model, over the budget of {self.budget:,.0f}: use at most {self.max_steps} steps with "
                f"{self.num_images} images, or {self.max_images} images with {self.steps} steps (each guidance adds "
                "UNet calls; the server's DENOISER_WORK_BUDGET sets the budget)"
            )


def work_of(unet, num_images: int, steps: int, guidance: Guidance | None = None, timesteps=None) -> Work:
    """The work of `num_images` images × `steps` steps of `unet`, the one rule the budget is counted by: a step
    costs the main model's passes (two with classifier-free guidance, one more with PAG, averaged over the
    `timesteps` visited when a guidance interval leaves some steps plain; every step counted guided when they
    are not known), each the model's cost per image-call (model_cost), plus the guide's call with autoguidance
    at the guide's own cost."""
    guidance = guidance or Guidance()
    guide_cost = model_cost(guidance.guide) / model_cost(unet) if guidance.autoguidance else 0.0
    per_step = model_cost(unet) * guidance.passes_per_step(timesteps, guide_cost)
    return Work(num_images, steps, per_step, work_budget(), guidance)


def plan_work(plan: Plan) -> Work:
    """The work of sampling a plan: its images and steps, its guidance over the timesteps its sampler visits."""
    return work_of(plan.unet, plan.num_images, plan.steps, plan.guidance, plan.timesteps())
