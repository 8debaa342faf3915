"""Training an SAE: on a tensor of activations (:func:`train_sae_on_activations`) or streamed from a
ViT's images (:func:`train_sae`); both take the same optimiser step (:func:`sae_step`).

**Loss.** With ``e = x − x̂`` the reconstruction error of a batch of tokens,

    L = mean_tokens ‖e‖²                                       (TopK)
    L = mean_tokens (‖e‖² + λ ‖f‖₁)                             (ReLU; the decoder rows have unit
                                                                 norm, so ‖f‖₁ = Σ_i f_i ‖W_dec,i‖)

plus, for both, the **AuxK** auxiliary loss for dead features (Gao et al. 2024, "Scaling and
evaluating sparse autoencoders", Appendix A.2): a feature is *dead* when it has not fired in the
last ``dead_after`` steps; ``ê = TopK_{k_aux}(relu(pre_dead)) W_dec`` reconstructs the error from
the ``k_aux = min(dead count, d_in // 2)`` largest dead pre-activations, and

    L_aux = mean_tokens ‖e − ê‖²,       loss = L + α L_aux       (α = 1/32, ``e`` detached)

which gives dead features a gradient towards the directions the live ones miss (chosen over
resampling: it needs no extra pass over the data and keeps training deterministic).

**Optimiser.** Adam (β = (0.9, 0.999)) with a linear warm-up of the learning rate over
``warmup_steps`` steps, then constant. Before each step the gradient's component parallel to each
decoder row is removed, after it the rows are renormalised (:class:`~analysis.sae.SparseAutoencoder`).
``b_dec`` starts at the mean activation of the first batch (Gao et al.: the geometric median; the
mean is its cheap stand-in). The seed fixes the initialisation and the order of tokens in each batch.

**Checkpoints.** With ``checkpoint_dir``, after each epoch ``checkpoint_dir/last/`` holds the SAE in
SAELens's format (``cfg.json`` + ``sae_weights.safetensors``), ``optimizer.safetensors`` (Adam's
moments) and ``state.json`` (epochs done, step, each feature's steps since it fired).
``resume=True`` continues from there, to the same weights as a run that was never interrupted.

**Ranks.** With ``parallel`` (:class:`~analysis.sae.parallel.DataParallel`, e.g. under ``torchrun``)
each rank reads its share of every batch's images, the losses are means over all ranks' tokens and
the gradients are summed over the ranks before each step, so every rank holds the weights one
process would; only rank 0 writes checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..base.progress import Progress, tell
from .errors import NoImagesError, SAEConfigError
from .model import SAEConfig, SparseAutoencoder, topk_activation
from .parallel import SINGLE_PROCESS, DataParallel
from .reading import check_point, count_images, pixel_batches, read_tokens
from .saelens import load_sae, save_sae

__all__ = ["TrainingState", "TrainingLog", "sae_step", "train_sae", "train_sae_on_activations", "AUX_COEFFICIENT"]

AUX_COEFFICIENT = 1 / 32


@dataclass
class TrainingState:
    """What a run carries from step to step: the step count and, per feature, the steps since it
    last fired ``(d_sae,)`` (a feature is dead after ``dead_after`` of them)."""

    step: int
    since_fired: torch.Tensor  # (d_sae,) int64


@dataclass
class TrainingLog:
    """The losses of each step (``loss``: the total, ``mse``: ``mean ‖x − x̂‖²``) and the dead
    fraction at the end of each epoch."""

    loss: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    dead_fraction: list[float] = field(default_factory=list)


def _make_optimizer(sae: SparseAutoencoder, lr: float) -> torch.optim.Adam:
    return torch.optim.Adam(sae.parameters(), lr=lr, betas=(0.9, 0.999))


def sae_step(
    sae: SparseAutoencoder,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    state: TrainingState,
    *,
    lr: float,
    warmup_steps: int,
    dead_after: int,
    parallel: DataParallel = SINGLE_PROCESS,
) -> tuple[float, float]:
    """One optimiser step on tokens ``x (n, d_in)`` (module docstring: loss, warm-up, AuxK);
    updates ``state`` and returns ``(loss, mse)``, means over the tokens of every rank (``parallel``:
    ``x`` is this rank's share of the batch, the gradients are summed over the ranks)."""
    x = x.to(sae.W_enc.dtype)
    count = float(parallel.reduce(torch.tensor([float(x.shape[0])], dtype=torch.float64))[0])  # N, all ranks
    if count == 0:
        raise NoImagesError("An SAE training step got no tokens on any rank: give it at least one image.")
    for group in optimizer.param_groups:
        group["lr"] = lr * min(1.0, (state.step + 1) / max(1, warmup_steps))
    pre = sae.pre_activation(x)  # (n, d_sae)
    f = sae.activation(pre)  # (n, d_sae)
    x_hat = sae.decode(f)  # (n, d_in)
    error = x - x_hat  # (n, d_in)
    mse = error.pow(2).sum() / count
    loss = mse
    if sae.config.architecture == "relu":
        loss = loss + float(sae.config.l1_coefficient or 0.0) * f.abs().sum() / count
    dead = state.since_fired >= dead_after  # (d_sae,)
    k_aux = min(int(dead.sum()), sae.config.d_in // 2)
    if k_aux > 0:
        dead_pre = pre.masked_fill(~dead, float("-inf"))  # (n, d_sae): live features never chosen
        f_aux = topk_activation(dead_pre, k_aux).nan_to_num(0.0)  # (n, d_sae)
        e_hat = f_aux @ sae.W_dec  # (n, d_in)
        loss = loss + AUX_COEFFICIENT * (error.detach() - e_hat).pow(2).sum() / count
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if parallel.world > 1:
        _sum_gradients(sae, parallel)
    sae.remove_parallel_gradient()
    optimizer.step()
    sae.normalise_decoder()
    fired_here = (f > 0).any(dim=0).double()  # (d_sae,)
    summed = parallel.reduce(torch.cat([fired_here, torch.stack([loss.detach(), mse.detach()]).double()]))
    fired = summed[:-2] > 0  # (d_sae,): fired on some rank
    state.since_fired = torch.where(fired, torch.zeros_like(state.since_fired), state.since_fired + 1)
    state.step += 1
    return float(summed[-2]), float(summed[-1])


def _sum_gradients(sae: SparseAutoencoder, parallel: DataParallel) -> None:
    """Every parameter's gradient replaced by its sum over the ranks (one all-reduce of them all)."""
    params = list(sae.parameters())
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    flat = parallel.reduce(torch.cat([g.reshape(-1) for g in grads]))  # (Σ numel,)
    start = 0
    for param, grad in zip(params, grads):
        param.grad = flat[start : start + grad.numel()].view_as(grad).clone()
        start += grad.numel()


def _new_sae(config: SAEConfig, seed: int) -> SparseAutoencoder:
    return SparseAutoencoder(config, generator=torch.Generator().manual_seed(int(seed)))


def _config(d_in, *, architecture, expansion, k, l1_coefficient, point, tokens, model_name, dtype) -> SAEConfig:
    if architecture == "relu" and (l1_coefficient is None or l1_coefficient < 0):
        raise SAEConfigError("A ReLU SAE needs l1_coefficient ≥ 0 (its sparsity penalty), e.g. 1e-3.")
    if int(expansion) < 1:
        raise SAEConfigError(f"expansion must be a positive integer (d_sae = expansion · d_in); got {expansion}.")
    return SAEConfig(
        d_in=int(d_in),
        d_sae=int(expansion) * int(d_in),
        architecture=architecture,
        k=None if k is None else int(k),
        l1_coefficient=None if l1_coefficient is None else float(l1_coefficient),
        hook_name=point,
        tokens=tokens,
        model_name=model_name,
        dtype=dtype,
    )


def _save_checkpoint(folder: Path, sae, optimizer, state: TrainingState, epochs_done: int) -> None:
    last = folder / "last"
    save_sae(sae, last)
    names = {id(p): n for n, p in sae.named_parameters()}
    moments = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                moments[f"{names[id(param)]}.{key}"] = torch.as_tensor(value).detach().clone().contiguous()
    save_file(moments, str(last / "optimizer.safetensors"))
    save_file({"since_fired": state.since_fired.contiguous()}, str(last / "state.safetensors"))
    (last / "state.json").write_text(json.dumps({"epochs_done": epochs_done, "step": state.step}))


def _load_checkpoint(folder: Path, lr: float):
    last = folder / "last"
    sae = load_sae(last)
    optimizer = _make_optimizer(sae, lr)
    moments = load_file(str(last / "optimizer.safetensors"))
    for name, param in sae.named_parameters():
        entries = {key.rsplit(".", 1)[1]: value for key, value in moments.items() if key.rsplit(".", 1)[0] == name}
        if entries:
            optimizer.state[param] = entries
    info = json.loads((last / "state.json").read_text())
    since = load_file(str(last / "state.safetensors"))["since_fired"]
    return sae, optimizer, TrainingState(step=int(info["step"]), since_fired=since), int(info["epochs_done"])


def _run(
    batches_of_epoch,
    total_steps: int,
    config: SAEConfig,
    first_batch,
    *,
    epochs,
    lr,
    warmup_steps,
    seed,
    dead_after,
    progress,
    checkpoint_dir,
    resume,
    parallel: DataParallel = SINGLE_PROCESS,
) -> tuple[SparseAutoencoder, TrainingLog]:
    log = TrainingLog()
    folder = None if checkpoint_dir is None else Path(checkpoint_dir)
    if resume and folder is not None and (folder / "last" / "state.json").exists():
        sae, optimizer, state, start_epoch = _load_checkpoint(folder, lr)
    else:
        sae = _new_sae(config, seed)
        first = first_batch().double()  # (n, d_in): this rank's share of the first batch
        summed = parallel.reduce(torch.cat([first.sum(0), torch.tensor([float(first.shape[0])], dtype=torch.float64)]))
        with torch.no_grad():
            sae.b_dec.copy_((summed[:-1] / summed[-1]).to(sae.b_dec.dtype))
        optimizer = _make_optimizer(sae, lr)
        state = TrainingState(step=0, since_fired=torch.zeros(config.d_sae, dtype=torch.long))
        start_epoch = 0
    steps_per_epoch = total_steps // max(1, epochs)
    tell(progress, start_epoch * steps_per_epoch, total_steps)
    for epoch in range(start_epoch, int(epochs)):
        for x in batches_of_epoch(epoch):
            loss, mse = sae_step(
                sae, optimizer, x, state, lr=lr, warmup_steps=warmup_steps, dead_after=dead_after, parallel=parallel
            )
            log.loss.append(loss)
            log.mse.append(mse)
            tell(progress, min(state.step, total_steps), total_steps)
        log.dead_fraction.append(float((state.since_fired >= dead_after).float().mean()))
        if folder is not None and parallel.is_main:
            _save_checkpoint(folder, sae, optimizer, state, epoch + 1)
    sae.eval()
    return sae, log


def train_sae_on_activations(
    acts: torch.Tensor,
    *,
    architecture: str = "topk",
    expansion: int = 8,
    k: int | None = None,
    l1_coefficient: float | None = None,
    lr: float = 1e-3,
    warmup_steps: int = 100,
    epochs: int = 1,
    batch_size: int = 256,
    seed: int = 0,
    dead_after: int = 200,
    point: str = "",
    tokens: str = "all",
    model_name: str = "",
    dtype: str = "float32",
    progress: Progress | None = None,
    checkpoint_dir=None,
    resume: bool = False,
) -> tuple[SparseAutoencoder, TrainingLog]:
    """Train an SAE on activations ``acts (N, d_in)`` (module docstring), ``batch_size`` rows a step,
    the rows in a seeded random order each epoch. Returns ``(sae, log)``; progress counts steps."""
    if acts.ndim != 2 or acts.shape[0] == 0:
        raise NoImagesError(
            f"train_sae_on_activations needs a non-empty (N, d_in) tensor; got shape {tuple(acts.shape)}."
        )
    config = _config(
        acts.shape[1],
        architecture=architecture,
        expansion=expansion,
        k=k,
        l1_coefficient=l1_coefficient,
        point=point,
        tokens=tokens,
        model_name=model_name,
        dtype=dtype,
    )
    count = acts.shape[0]
    size = int(batch_size)

    def batches(epoch: int) -> Iterator[torch.Tensor]:
        order = torch.randperm(count, generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch))
        for start in range(0, count, size):
            yield acts[order[start : start + size]]

    steps = -(-count // size) * int(epochs)
    return _run(
        batches,
        steps,
        config,
        lambda: acts[:size].float(),
        epochs=epochs,
        lr=lr,
        warmup_steps=warmup_steps,
        seed=seed,
        dead_after=dead_after,
        progress=progress,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
    )


def train_sae(
    vit,
    images,
    point: str,
    *,
    architecture: str = "topk",
    expansion: int = 8,
    k: int | None = None,
    l1_coefficient: float | None = None,
    lr: float = 1e-3,
    warmup_steps: int = 100,
    epochs: int = 1,
    batch_size: int = 16,
    tokens: str = "patches",
    seed: int = 0,
    dead_after: int = 200,
    dtype: str = "float32",
    progress: Progress | None = None,
    checkpoint_dir=None,
    resume: bool = False,
    parallel: DataParallel = SINGLE_PROCESS,
) -> tuple[SparseAutoencoder, TrainingLog]:
    """Train an SAE on ``vit``'s activations at ``point`` over ``images`` (PIL images or an
    ``(N, 3, H, W)`` preprocessed tensor), streamed: each step runs one forward pass over
    ``batch_size`` images (:func:`analysis.engine.activations.run_with_cache`) and trains on their chosen
    ``tokens`` (``(batch_size · T_chosen, D)``, in a seeded order), so only one batch's
    activations are held. ``expansion``: ``d_sae = expansion · D``; ``k`` (TopK) or
    ``l1_coefficient`` (ReLU). Returns ``(sae, log)``; progress counts steps of all epochs.
    ``parallel``: this process's rank among data-parallel ranks (module docstring), each reading its
    share of every batch of the same ``images``; the default trains alone.

    Raises:
        UnknownPointError: ``point`` is not a ``(B, T, D)`` point of this model.
        NoImagesError: no images.
        SAEConfigError: ``k`` outside ``1..d_sae``, an unknown architecture or token choice.
    """
    name = check_point(vit, point)
    total = count_images(images)
    if total == 0:
        raise NoImagesError(
            "train_sae got no images: pass at least one (a list of PIL images or an (N, 3, H, W) tensor)."
        )
    width = vit.spec.embed_dim
    config = _config(
        width,
        architecture=architecture,
        expansion=expansion,
        k=k,
        l1_coefficient=l1_coefficient,
        point=name,
        tokens=tokens,
        model_name=str(vit.name),
        dtype=dtype,
    )

    def tokens_of(pixels: torch.Tensor) -> torch.Tensor:
        if pixels.shape[0] == 0:  # this rank has no image in this batch
            return torch.zeros(0, width)
        chosen, _ = read_tokens(vit, pixels, name, tokens)  # (b, T_chosen, D)
        return chosen.reshape(-1, chosen.shape[-1])  # (b·T_chosen, D)

    def my_batches():
        return pixel_batches(vit, images, batch_size, rank=parallel.rank, world=parallel.world)

    def batches(epoch: int) -> Iterator[torch.Tensor]:
        for index, pixels in enumerate(my_batches()):
            x = tokens_of(pixels)
            order = torch.randperm(
                x.shape[0], generator=torch.Generator().manual_seed(int(seed) * 1_000_003 + epoch * 65_537 + index)
            )
            yield x[order]

    steps = -(-total // int(batch_size)) * int(epochs)
    return _run(
        batches,
        steps,
        config,
        lambda: tokens_of(next(my_batches())),
        epochs=epochs,
        lr=lr,
        warmup_steps=warmup_steps,
        seed=seed,
        dead_after=dead_after,
        progress=progress,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        parallel=parallel,
    )
