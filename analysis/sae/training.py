"""Training an SAE: on a tensor of activations (:func:`train_sae_on_activations`) or streamed from a
ViT's images (:func:`train_sae`); both take the same optimiser step (:func:`sae_step`).

**Loss.** With ``e = s·x − (f W_dec + b_dec)`` the reconstruction error of a batch of tokens in the
SAE's units (``s`` the input scale below, 1 without normalisation),

    L = mean_tokens ‖e‖²                                       (TopK)
    L = mean_tokens (‖e‖² + λ ‖f‖₁)                             (ReLU; the decoder rows have unit
                                                                 norm, so ‖f‖₁ = Σ_i f_i ‖W_dec,i‖)

plus, for both, the **AuxK** auxiliary loss for dead features (Gao et al. 2024, "Scaling and
evaluating sparse autoencoders", Appendix A.2): during training a feature counts as dead, here
called *inactive*, when it has not fired in the last ``dead_after`` steps;
``ê = TopK_{k_aux}(relu(pre_inactive)) W_dec`` reconstructs the error from the
``k_aux = min(inactive count, d_in // 2)`` largest inactive pre-activations, and

    L_aux = mean_tokens ‖e − ê‖²,       loss = L + α L_aux       (α = 1/32, ``e`` detached)

which gives inactive features a gradient towards the directions the live ones miss (chosen over
resampling: it needs no extra pass over the data and keeps training deterministic).
:attr:`TrainingLog.inactive_fraction` is their share at the end of each epoch; it is not
:attr:`~analysis.sae.SAEMetrics.dead_fraction`, the share of features that never fire on a whole
evaluation set.

**Token order.** A step trains on ``batch_size`` images' worth of tokens drawn across many images,
as saev's and SAELens's shuffled activation stores do, never on the tokens of a few images at once.
:func:`train_sae` fills a buffer with the chosen tokens of ``buffer_batches · batch_size`` images,
shuffles them and cuts them into ``buffer_batches`` batches; the rule, per epoch ``e``, with one
generator seeded by ``(seed, e)``:

    1. the image order is a random permutation of the ``N`` images;
    2. consecutive runs of ``buffer_batches · batch_size`` images of that order are the buffers (the
       last may be shorter);
    3. a buffer's ``m · T`` token rows (``T`` chosen tokens per image, row ``p·T + t`` for the ``t``-th
       token of its ``p``-th image) are permuted, and each ``batch_size · T`` consecutive rows of the
       permutation are one step's batch (the last may be shorter).

So an epoch has ``ceil(N / batch_size)`` steps, every token is used once, and at most one buffer's
tokens are held (``buffer_batches · batch_size · T · d_in`` floats, split over the ranks).
:func:`train_sae_on_activations` holds all its rows already, so its buffer is the whole tensor: each
epoch is a seeded permutation of all rows. The same seed gives bit-identical weights.

**Input normalisation.** With ``normalise=True`` the SAE trains on ``s·x`` with the scalar

    s = sqrt(d_in) / mean_tokens ‖x‖           (so the mean norm of s·x is sqrt(d_in))

estimated on the first buffer of the first epoch (all of ``acts`` for
:func:`train_sae_on_activations`), kept in ``config.norm_scaling_factor`` and applied wherever the
SAE reads or writes activations (:mod:`analysis.sae.model`). This is SAELens's
``normalize_activations="expected_average_only_in"`` (``ActivationScaler.estimate_scaling_factor``:
``sqrt(d_in) / mean ‖x‖``) and saev's ``scale_norm`` without ``scale_mean`` (``x / scalar`` with
``scalar = mean ‖x‖ / sqrt(d_vit)``); Anthropic's "Scaling Monosemanticity" asks for a mean
*squared* norm of ``d_in``, which differs by the spread of the norms (``E‖x‖² ≥ (E‖x‖)²``). It
makes ``lr``, ``l1_coefficient`` and the losses comparable across layers and models whose
activations differ in scale. Off by default: the weights of an unnormalised run are what they were.

**Optimiser.** Adam (β = (0.9, 0.999)) with a linear warm-up of the learning rate over
``warmup_steps`` steps, then constant. Before each step the gradient's component parallel to each
decoder row is removed, after it the rows are renormalised (:class:`~analysis.sae.SparseAutoencoder`).
``b_dec`` starts at the mean of the first buffer's tokens (in the SAE's units; Gao et al.: the
geometric median; the mean is its cheap stand-in). The seed fixes the initialisation and the order
of images and tokens.

**Checkpoints.** With ``checkpoint_dir``, after each epoch ``checkpoint_dir/last/`` holds the SAE in
SAELens's format (``cfg.json`` + ``sae_weights.safetensors``), ``optimizer.safetensors`` (Adam's
moments), ``state.json`` (epochs done, step) and ``state.safetensors`` (each feature's steps since
it fired, and the SAE's parameters exactly: a normalised SAE's folder holds them folded,
:mod:`analysis.sae.saelens`).
``resume=True`` continues from there, to the same weights as a run that was never interrupted.

**Ranks.** With ``parallel`` (:class:`~analysis.sae.parallel.DataParallel`, e.g. under ``torchrun``)
every rank draws the same orders from the seed; rank ``r`` of ``W`` reads the images at positions
``r, r + W, ...`` of each buffer and trains on the rows of each step's batch that come from them,
the losses are means over all ranks' tokens and the gradients are summed over the ranks before each
step, so the ranks together take the one-process step on the one-process batch and every rank
holds the weights one process would; only rank 0 writes checkpoints.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..base.arguments import check_int
from ..base.errors import AnalysisError
from ..base.progress import Progress, tell
from .errors import NoImagesError, SAEConfigError
from .model import SAEConfig, SparseAutoencoder, topk_activation
from .parallel import SINGLE_PROCESS, DataParallel
from .reading import check_point, count_images, images_slice, pixel_batches, read_tokens, token_indices
from .saelens import load_sae, save_sae

__all__ = ["TrainingState", "TrainingLog", "sae_step", "train_sae", "train_sae_on_activations", "AUX_COEFFICIENT"]

AUX_COEFFICIENT = 1 / 32

#: one buffer of a run (module docstring): this rank's token rows ``(n, d_in)``, and for each step of
#: the buffer the rows of that tensor that are this rank's share of the step's batch (``(n_step,)``
#: int64 each).
Buffer = tuple[torch.Tensor, list[torch.Tensor]]


@dataclass
class TrainingState:
    """What a run carries from step to step (:func:`sae_step` updates it in place).

    Attributes
    ----------
    step : int
        Optimiser steps taken.
    since_fired : torch.Tensor
        ``(d_sae,)`` int64, per feature the steps since it last fired (a feature is inactive, and
        takes part in AuxK, after ``dead_after`` of them).
    """

    step: int
    since_fired: torch.Tensor  # (d_sae,) int64


@dataclass
class TrainingLog:
    """The losses of each step and the inactive fraction at the end of each epoch (of this run: a
    resumed run logs only the epochs it trained).

    Attributes
    ----------
    loss : list of float
        Each step's total loss (reconstruction, L1 for a ReLU SAE, and AuxK), in the SAE's units.
    mse : list of float
        Each step's ``mean ‖s·x − (f W_dec + b_dec)‖²`` over the tokens (``s`` = 1 without input
        normalisation; with it, in the normalised units).
    inactive_fraction : list of float
        At the end of each epoch, the share of features that fired on no token of the last
        ``dead_after`` steps (the features AuxK trains). Not
        :attr:`~analysis.sae.SAEMetrics.dead_fraction` (never firing on an evaluation set).
    """

    loss: list[float] = field(default_factory=list)
    mse: list[float] = field(default_factory=list)
    inactive_fraction: list[float] = field(default_factory=list)


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
    """One optimiser step on a batch of tokens (module docstring: loss, warm-up, AuxK); updates
    ``state`` in place.

    Parameters
    ----------
    sae : SparseAutoencoder
        The SAE, trained in place.
    optimizer : torch.optim.Optimizer
        The optimiser of ``sae``'s parameters (Adam); its learning rate is set for this step.
    x : torch.Tensor
        ``(n, d_in)`` tokens in the model's units, this rank's share of the batch (``n`` may be 0 on
        some ranks); the SAE scales them (``config.norm_scaling_factor``).
    state : TrainingState
        The step count and each feature's steps since it fired.
    lr : float
        The learning rate after the warm-up.
    warmup_steps : int
        Steps of linear warm-up: step ``s`` uses ``lr · min(1, (s + 1) / warmup_steps)``.
    dead_after : int
        A feature that has not fired in this many steps is inactive (it takes part in AuxK).
    parallel : DataParallel, default SINGLE_PROCESS
        This process's rank; the token count, gradients and firing features are summed over the
        ranks.

    Returns
    -------
    tuple of (float, float)
        ``(loss, mse)``, means over the tokens of every rank, in the SAE's units.

    Raises
    ------
    NoImagesError
        No tokens on any rank.
    """
    x = sae.scale_input(x)  # (n, d_in) in the SAE's units: s·x, or x without normalisation
    count = float(parallel.reduce(torch.tensor([float(x.shape[0])], dtype=torch.float64))[0])  # N, all ranks
    if count == 0:
        raise NoImagesError("An SAE training step got no tokens on any rank: give it at least one image.")
    for group in optimizer.param_groups:
        group["lr"] = lr * min(1.0, (state.step + 1) / max(1, warmup_steps))
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc  # (n, d_sae): sae.pre_activation of the unscaled x
    f = sae.activation(pre)  # (n, d_sae)
    x_hat = sae.decode_scaled(f)  # (n, d_in), the SAE's units
    error = x - x_hat  # (n, d_in)
    mse = error.pow(2).sum() / count
    loss = mse
    if sae.config.architecture == "relu":
        loss = loss + float(sae.config.l1_coefficient or 0.0) * f.abs().sum() / count
    inactive = state.since_fired >= dead_after  # (d_sae,)
    k_aux = min(int(inactive.sum()), sae.config.d_in // 2)
    if k_aux > 0:
        inactive_pre = pre.masked_fill(~inactive, float("-inf"))  # (n, d_sae): live features never chosen
        f_aux = topk_activation(inactive_pre, k_aux).nan_to_num(0.0)  # (n, d_sae)
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


def _check_sizes(*, expansion, epochs, batch_size, warmup_steps, dead_after, buffer_batches=1) -> tuple[int, ...]:
    """The integer sizes of a training run, checked before any work: ``expansion``, ``epochs``,
    ``batch_size``, ``buffer_batches`` and ``dead_after`` at least 1, ``warmup_steps`` at least 0
    (:func:`~analysis.base.arguments.check_int`: integers, not bools or floats).

    Parameters
    ----------
    expansion, epochs, batch_size, warmup_steps, dead_after, buffer_batches : Any
        The arguments of :func:`train_sae` (``buffer_batches`` only there) as given.

    Returns
    -------
    tuple of int
        ``(expansion, epochs, batch_size, warmup_steps, dead_after, buffer_batches)`` as plain ints.

    Raises
    ------
    SAEConfigError
        One of them is not an integer or is below its minimum; the message names it, the value and
        the minimum.
    """
    sizes = (
        ("expansion", expansion, 1),
        ("epochs", epochs, 1),
        ("batch_size", batch_size, 1),
        ("warmup_steps", warmup_steps, 0),
        ("dead_after", dead_after, 1),
        ("buffer_batches", buffer_batches, 1),
    )
    try:
        return tuple(check_int(name, value, minimum=minimum) for name, value, minimum in sizes)
    except AnalysisError as error:
        raise SAEConfigError(str(error)) from None


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
    exact = {f"sae.{name}": param.detach().cpu().contiguous() for name, param in sae.named_parameters()}
    save_file({"since_fired": state.since_fired.contiguous(), **exact}, str(last / "state.safetensors"))
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
    saved = load_file(str(last / "state.safetensors"))
    with torch.no_grad():  # the exact parameters (the folder's are folded for a normalised SAE)
        for name, param in sae.named_parameters():
            param.copy_(saved[f"sae.{name}"])
    since = saved["since_fired"]
    return sae, optimizer, TrainingState(step=int(info["step"]), since_fired=since), int(info["epochs_done"])


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of one epoch's orders: the same on every rank, and for a resumed epoch."""
    return torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))


def _rank_rows(rows: torch.Tensor, per_image: int, parallel: DataParallel) -> torch.Tensor:
    """This rank's share of a batch of a buffer's global rows (module docstring), as rows of its own
    tokens: global row ``g = p·T + t`` (image position ``p``, token ``t``) belongs to rank ``p mod W``,
    which holds it at row ``(p div W)·T + t``.

    ``rows``: ``(n,)`` int64 global rows; returns ``(n_rank,)`` int64 local rows, in ``rows``' order."""
    position, token = rows // per_image, rows % per_image  # (n,), (n,)
    mine = position % parallel.world == parallel.rank  # (n,)
    return (position[mine] // parallel.world) * per_image + token[mine]


def _initial_sae(
    config: SAEConfig, tokens: torch.Tensor, *, seed: int, normalise: bool, parallel: DataParallel
) -> SparseAutoencoder:
    """A new SAE for ``tokens`` ``(n, d_in)``, this rank's rows of the first buffer: with ``normalise``
    its ``norm_scaling_factor`` is ``s = sqrt(d_in) / mean ‖x‖``; ``b_dec`` is ``s`` times the mean
    token (module docstring), both over every rank's rows."""
    x = tokens.double()  # (n, d_in)
    count = torch.tensor([float(x.shape[0])], dtype=torch.float64)
    summed = parallel.reduce(torch.cat([x.sum(0), x.norm(dim=1).sum().reshape(1), count]))  # (d_in + 2,)
    mean, mean_norm = summed[:-2] / summed[-1], float(summed[-2] / summed[-1])  # (d_in,), float
    if normalise:
        if not mean_norm > 0:
            raise SAEConfigError("normalise=True needs tokens that are not all zero: their mean norm is 0.")
        config = dataclasses.replace(config, norm_scaling_factor=math.sqrt(config.d_in) / mean_norm)
    sae = _new_sae(config, seed)
    scale = config.norm_scaling_factor
    with torch.no_grad():
        sae.b_dec.copy_((mean if scale is None else mean * scale).to(sae.b_dec.dtype))
    return sae


def _run(
    buffers_of_epoch: Callable[[int], Iterator[Buffer]],
    total_steps: int,
    config: SAEConfig,
    *,
    normalise: bool,
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
    first_epoch: Iterator[Buffer] | None = None
    if resume and folder is not None and (folder / "last" / "state.json").exists():
        sae, optimizer, state, start_epoch = _load_checkpoint(folder, lr)
    else:
        stream = buffers_of_epoch(0)
        first = next(stream)  # the first buffer: the input scale and b_dec, then trained on as usual
        sae = _initial_sae(config, first[0], seed=seed, normalise=normalise, parallel=parallel)
        first_epoch = itertools.chain([first], stream)
        optimizer = _make_optimizer(sae, lr)
        state = TrainingState(step=0, since_fired=torch.zeros(config.d_sae, dtype=torch.long))
        start_epoch = 0
    steps_per_epoch = total_steps // max(1, epochs)
    tell(progress, start_epoch * steps_per_epoch, total_steps)
    for epoch in range(start_epoch, int(epochs)):
        buffers = first_epoch if epoch == 0 and first_epoch is not None else buffers_of_epoch(epoch)
        for tokens, steps in buffers:  # (n, d_in), this rank's rows of each step
            for rows in steps:
                loss, mse = sae_step(
                    sae,
                    optimizer,
                    tokens[rows],
                    state,
                    lr=lr,
                    warmup_steps=warmup_steps,
                    dead_after=dead_after,
                    parallel=parallel,
                )
                log.loss.append(loss)
                log.mse.append(mse)
                tell(progress, min(state.step, total_steps), total_steps)
        log.inactive_fraction.append(float((state.since_fired >= dead_after).float().mean()))
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
    normalise: bool = False,
    point: str = "",
    tokens: str = "all",
    model_name: str = "",
    dtype: str = "float32",
    progress: Progress | None = None,
    checkpoint_dir=None,
    resume: bool = False,
) -> tuple[SparseAutoencoder, TrainingLog]:
    """Train an SAE on activations (module docstring), ``batch_size`` rows a step, the rows in a
    seeded random order each epoch (a permutation of all ``N`` rows: the buffer is ``acts``).

    Parameters
    ----------
    acts : torch.Tensor
        ``(N, d_in)`` activations, ``N ≥ 1``.
    architecture : str, default "topk"
        ``"topk"`` or ``"relu"``.
    expansion : int, default 8
        ``d_sae = expansion · d_in``, a positive integer.
    k : int or None, default None
        Features kept per token (TopK, required there; ``1 ≤ k ≤ d_sae``).
    l1_coefficient : float or None, default None
        The sparsity penalty ``λ`` (ReLU, required there; ``≥ 0``).
    lr : float, default 1e-3
        Adam's learning rate after the warm-up.
    warmup_steps : int, default 100
        Steps of linear learning-rate warm-up, ``≥ 0`` (0: none).
    epochs : int, default 1
        Passes over ``acts``, ``≥ 1``.
    batch_size : int, default 256
        Rows per step, ``≥ 1``.
    seed : int, default 0
        Fixes the initialisation and the row order of each epoch.
    dead_after : int, default 200
        Steps without firing after which a feature is inactive (AuxK), ``≥ 1``.
    normalise : bool, default False
        Train on ``s·x`` with ``s = sqrt(d_in) / mean ‖x‖`` over all of ``acts`` (module docstring),
        kept in the SAE's ``config.norm_scaling_factor``.
    point : str, default ""
        The hook point the activations come from, recorded in the config.
    tokens : str, default "all"
        The token choice the activations come from, recorded in the config.
    model_name : str, default ""
        The model they come from, recorded in the config.
    dtype : str, default "float32"
        The SAE's parameter dtype.
    progress : Progress or None, default None
        Called as ``progress(done, total)``, counting steps of all epochs.
    checkpoint_dir : str, os.PathLike or None, default None
        Where ``last/`` is written after each epoch (module docstring).
    resume : bool, default False
        Continue from ``checkpoint_dir/last/`` when it holds a checkpoint (its SAE and config).

    Returns
    -------
    tuple of (SparseAutoencoder, TrainingLog)
        ``(sae, log)``: the trained SAE in eval mode and its losses.

    Raises
    ------
    NoImagesError
        ``acts`` is not a non-empty 2-D tensor.
    SAEConfigError
        ``k`` outside ``1..d_sae``, a ReLU SAE without ``l1_coefficient ≥ 0``, ``expansion``,
        ``epochs``, ``batch_size`` or ``dead_after`` not an integer ``≥ 1``, ``warmup_steps`` not an
        integer ``≥ 0``, an unknown architecture, token choice or dtype; ``normalise`` with all-zero
        activations.
    """
    expansion, epochs, size, warmup_steps, dead_after, _ = _check_sizes(
        expansion=expansion, epochs=epochs, batch_size=batch_size, warmup_steps=warmup_steps, dead_after=dead_after
    )
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

    def buffers(epoch: int) -> Iterator[Buffer]:
        order = torch.randperm(count, generator=_epoch_generator(seed, epoch))  # (N,)
        yield acts, [order[start : start + size] for start in range(0, count, size)]

    steps = -(-count // size) * epochs
    return _run(
        buffers,
        steps,
        config,
        normalise=normalise,
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
    buffer_batches: int = 16,
    tokens: str = "patches",
    seed: int = 0,
    dead_after: int = 200,
    normalise: bool = False,
    dtype: str = "float32",
    progress: Progress | None = None,
    checkpoint_dir=None,
    resume: bool = False,
    parallel: DataParallel = SINGLE_PROCESS,
) -> tuple[SparseAutoencoder, TrainingLog]:
    """Train an SAE on ``vit``'s activations at ``point`` over ``images``, streamed through a shuffle
    buffer (module docstring): the chosen ``tokens`` of ``buffer_batches · batch_size`` images are
    read (forward passes of ``batch_size`` images, :func:`analysis.engine.activations.run_with_cache`),
    shuffled together and trained on ``batch_size · T_chosen`` rows a step, so a step mixes the
    tokens of many images and only one buffer's activations are held.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), a global-attention ViT.
    images : sequence of PIL.Image.Image or torch.Tensor
        PIL images (each through ``vit.preprocess``) or an already preprocessed ``(N, 3, H, W)`` tensor.
    point : str
        The hook point, ``blocks.{i}.<point>`` with ``<point>`` in :data:`RESIDUAL_POINTS`, or
        ``ln_final.out``.
    architecture : str, default "topk"
        ``"topk"`` or ``"relu"``.
    expansion : int, default 8
        ``d_sae = expansion · D``, a positive integer.
    k : int or None, default None
        Features kept per token (TopK, required there; ``1 ≤ k ≤ d_sae``).
    l1_coefficient : float or None, default None
        The sparsity penalty ``λ`` (ReLU, required there; ``≥ 0``).
    lr : float, default 1e-3
        Adam's learning rate after the warm-up.
    warmup_steps : int, default 100
        Steps of linear learning-rate warm-up, ``≥ 0`` (0: none).
    epochs : int, default 1
        Passes over ``images``, ``≥ 1``.
    batch_size : int, default 16
        Images' worth of tokens per step (``batch_size · T_chosen`` rows), and images per forward
        pass.
    buffer_batches : int, default 16
        Steps per shuffle buffer: the tokens of ``buffer_batches · batch_size`` images are shuffled
        together (1: within each step's images only).
    tokens : str, default "patches"
        ``"patches"``, ``"class"`` or ``"all"`` (:data:`TOKEN_CHOICES`).
    seed : int, default 0
        Fixes the initialisation, each epoch's image order and each buffer's token order.
    dead_after : int, default 200
        Steps without firing after which a feature is inactive (AuxK), ``≥ 1``.
    normalise : bool, default False
        Train on ``s·x`` with ``s = sqrt(D) / mean ‖x‖`` over the first buffer's tokens (module
        docstring), kept in the SAE's ``config.norm_scaling_factor``.
    dtype : str, default "float32"
        The SAE's parameter dtype.
    progress : Progress or None, default None
        Called as ``progress(done, total)``, counting steps of all epochs.
    checkpoint_dir : str, os.PathLike or None, default None
        Where ``last/`` is written after each epoch (module docstring); only rank 0 writes.
    resume : bool, default False
        Continue from ``checkpoint_dir/last/`` when it holds a checkpoint (its SAE and config).
    parallel : DataParallel, default SINGLE_PROCESS
        This process's rank among data-parallel ranks (module docstring), each reading its share of
        every buffer of the same ``images``; the default trains alone.

    Returns
    -------
    tuple of (SparseAutoencoder, TrainingLog)
        ``(sae, log)``: the trained SAE in eval mode and its losses.

    Raises
    ------
    UnknownPointError
        ``point`` is not a ``(B, T, D)`` point of this model.
    NoImagesError
        No images.
    SAEConfigError
        ``k`` outside ``1..d_sae``, a ReLU SAE without ``l1_coefficient ≥ 0``, ``expansion``,
        ``epochs``, ``batch_size``, ``buffer_batches`` or ``dead_after`` not an integer ``≥ 1``,
        ``warmup_steps`` not an integer ``≥ 0`` (all checked before any image is read), an unknown
        architecture, token choice or dtype, ``tokens="class"`` on a model without a class token;
        ``normalise`` with all-zero tokens.
    """
    expansion, epochs, size, warmup_steps, dead_after, buffer_batches = _check_sizes(
        expansion=expansion,
        epochs=epochs,
        batch_size=batch_size,
        warmup_steps=warmup_steps,
        dead_after=dead_after,
        buffer_batches=buffer_batches,
    )
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

    per_buffer = size * buffer_batches
    per_image = int(token_indices(vit.spec, tokens).numel())  # T_chosen

    def tokens_of(indices: list[int]) -> torch.Tensor:
        """The chosen tokens of the images at ``indices``, ``(len · T_chosen, D)`` float32, read
        ``batch_size`` images a forward pass."""
        parts = [torch.zeros(0, width)]
        for start in range(0, len(indices), size):
            chunk = images_slice(images, indices[start : start + size])
            for pixels in pixel_batches(vit, chunk, size):  # one batch
                chosen, _ = read_tokens(vit, pixels, name, tokens)  # (b, T_chosen, D)
                parts.append(chosen.reshape(-1, width))
        return torch.cat(parts)

    def buffers(epoch: int) -> Iterator[Buffer]:
        generator = _epoch_generator(seed, epoch)
        order = torch.randperm(total, generator=generator)  # (N,) this epoch's image order
        for start in range(0, total, per_buffer):
            held = order[start : start + per_buffer]  # (m,) the buffer's images, by position p
            mine = held[parallel.rank :: parallel.world].tolist()  # positions rank, rank + W, ...
            rows = torch.randperm(held.numel() * per_image, generator=generator)  # (m·T,) global rows
            step_rows = size * per_image
            steps = [
                _rank_rows(rows[at : at + step_rows], per_image, parallel) for at in range(0, rows.numel(), step_rows)
            ]
            yield tokens_of(mine), steps

    steps = -(-total // size) * epochs
    return _run(
        buffers,
        steps,
        config,
        normalise=normalise,
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
