"""The research systems as named strategies: each a few lines composing jaxoff's parts.

Every docstring says what the strategy keeps from its paper and what the paper does that
jaxoff does not: decisions taken at run time (eviction, adaptive windows, measured first
iterations), searches over a schedule, activation swapping to SSD, kernels of its own. Under
XLA's static compilation there is one compiled program per step, one plan for every scanned
layer, and transfers are scheduled by XLA. On a CPU, XLA drops host placements of
activations: offloaded residuals stay in device memory there (see ``docs/guide/policies.md``).
"""

from __future__ import annotations

from ..plan import Plan, evaluate
from ._planners import capuchin_actions, checkmate_actions, dtr_actions, policy_spelling
from ._recipe import Context, Recipe, register


@register(
    "vdnn",
    paper="Rhu et al. 2016, 'vDNN: Virtualized Deep Neural Networks for Scalable, "
    "Memory-Efficient Neural Network Design' (MICRO)",
)
def vdnn(ctx: Context) -> Recipe:
    """Every layer's activations to host memory in forward, back for backward.

    Keeps: offload of all saved activations of every layer (vDNN_all), prefetch before
    backward needs them. Differs: vDNN issues its copies and prefetches at layer
    boundaries at run time; here ``offload_all`` marks each named residual for
    ``pinned_host`` and XLA's host-offload passes and scheduler place the copies and the
    prefetches in the compiled program. Intermediates without a name are recomputed, not
    offloaded. Not done: vDNN_dyn, which profiles at run time to choose which layers to
    offload and each layer's convolution algorithm; vDNN_conv's per-layer-type choice.
    """
    return Recipe(policy="offload_all")


@register(
    "te_offload",
    paper="NVIDIA TransformerEngine, te.pytorch.get_cpu_offload_context "
    "(activation CPU offloading of num_layers layers)",
)
def te_offload(ctx: Context) -> Recipe:
    """Activations of the first N layers to host memory, the others kept on device.

    Keeps: TE's per-layer switch (offload N layers; the last layers, whose backward comes
    first, stay on device). N: the fewest layers whose offload fits ``device_mem`` by the
    planner's profile, else half the layers. Differs: TE hooks tensors as PyTorch saves
    them and overlaps each layer's copies with the next layer's compute on its own stream;
    here the layer scan is split in two scans (``jaxoff.nn.Stack.split_layers``) with
    ``offload_all`` on the first and no remat on the second, and XLA schedules the copies.
    Not done: TE's offload of the layers' weights.
    """
    L = ctx.model_config.num_layers
    n = max(1, L // 2)
    if ctx.device_mem is not None:
        prof, hw = ctx.profile(), ctx.hw()
        keep = evaluate(prof, hw, Plan.from_actions(prof, {n.name: "device" for n in prof.names}))
        off = evaluate(prof, hw, Plan.from_actions(prof, {n.name: "offload" for n in prof.names}))
        per_layer = (keep.device_bytes - off.device_bytes) / L
        n = next(
            (k for k in range(1, L + 1) if keep.device_bytes - k * per_layer <= hw.device_mem), L
        )
    return Recipe(
        policy="none",
        stack_overrides={"split_layers": n, "split_policy": "offload_all"},
        note=f"first {n} of {L} layers offloaded",
    )


@register(
    "chen_sqrt",
    paper="Chen et al. 2016, 'Training Deep Nets with Sublinear Memory Cost' (arXiv:1604.06174)",
)
def chen_sqrt(ctx: Context) -> Recipe:
    """Keep every k-th layer boundary; recompute each segment's forward once in backward.

    Keeps: Chen et al.'s segments of k = round(sqrt(L)) layers: only the boundaries between
    segments are kept, a segment's forward is recomputed once in backward, so activation
    memory is ``ceil(L / k)`` boundaries plus one segment's interior (about sqrt(L)), and the
    cost one extra forward; the last segment may be shorter. Differs: one k for every
    segment, as XLA scans a reshaped stack of equal segments (``jaxoff.nn.Stack.remat_every``),
    where the paper's planner places each boundary by the layers' own sizes under a memory
    budget it searches (the ``sqrt_bytes`` policy preset chooses k from the traced block's
    bytes instead); not done: the paper's recursive variant (O(log L) memory for
    O(L log L) recomputation) and its in-place memory sharing inside a segment.
    """
    return Recipe(policy="sqrt")


@register(
    "megatron_selective",
    paper="Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer "
    "Models' (MLSys 2023)",
)
def megatron_selective(ctx: Context) -> Recipe:
    """Recompute the attention scores and softmax, keep the rest (the context included).

    Keeps: selective recomputation (Sec. 4.2): the ``[B, H, T, T]`` tensors, large and
    cheap to recompute, are dropped and recomputed from the kept q and k; the core
    attention's output, the context, is kept. The per-layer bytes are Korthikanti et al.'s
    accounting less the dropout masks (``tests/test_activation_bytes.py``). Differs: the
    models have no dropout; Megatron re-runs the whole core attention in backward (a
    checkpointed function), JAX recomputes only what backward reads (not probs x V, whose
    output is kept). Not done: tensor and sequence parallelism, which divide the kept
    bytes by the parallel size in the paper (one device here).
    """
    return Recipe(policy="selective")


@register(
    "checkmate",
    paper="Jain et al. 2020, 'Checkmate: Breaking the Memory Wall with Optimal Tensor "
    "Rematerialization' (MLSys)",
    budgeted=True,
)
def checkmate(ctx: Context) -> Recipe:
    """Optimal keep-or-recompute per residual under the device budget (MILP).

    Keeps: an integer program over which tensors to keep or recompute, minimising compute
    time subject to the memory budget, no offload. Differs: Checkmate's MILP searches a
    whole schedule, when each operation of the graph is computed and recomputed and when
    each value is freed, with memory accounted at every stage; here the decision is per
    residual *name*, the same for every scanned layer (XLA compiles the block once), the
    values without a name are recomputed, and XLA orders the operations. Costs come from
    the planner's profile (``jaxoff.plan.solve(actions=("device", "remat"))``, parameters
    and states on device), not from per-operation profiling on the target.
    """
    return Recipe(policy=policy_spelling(checkmate_actions(ctx)), note="MILP, remat only")


@register(
    "dtr_greedy",
    paper="Kirisame et al. 2021, 'Dynamic Tensor Rematerialization' (ICLR)",
    budgeted=True,
)
def dtr_greedy(ctx: Context) -> Recipe:
    """DTR's eviction score (cost / (size x staleness)) used as a static planner.

    Keeps: the heuristic h(t) = cost(t) / (memory(t) x staleness(t)) with the evicted
    neighbourhood in the cost, evicting the lowest score until the budget holds. Differs:
    DTR evicts dynamically, at run time, when an allocation fails, any tensor at any
    moment, and recomputes evicted tensors on demand; that is not expressible in XLA, whose
    memory plan is fixed at compile time. The heuristic runs once over the profile, on
    residual names (one choice for every layer), and its result compiles as a remat policy.
    """
    return Recipe(policy=policy_spelling(dtr_actions(ctx)), note="static DTR heuristic")


@register(
    "capuchin",
    paper="Peng et al. 2020, 'Capuchin: Tensor-based GPU Memory Management for Deep "
    "Learning' (ASPLOS); also STR (Zhang et al.) / DELTA-style swap+recompute hybrids",
    budgeted=True,
)
def capuchin(ctx: Context) -> Recipe:
    """Per tensor: swap to host while the transfer hides behind compute, else recompute.

    Keeps: the per-tensor choice between swapping and recomputing by their cost (transfer
    time not overlapped vs recompute time), largest tensors first, until the budget holds;
    this is the hybrid STR and DELTA also make. Differs: Capuchin measures tensor accesses
    in a first iteration, decides and times each swap-in at run time and revises the plan
    when the measured timing changes; here the profile's bytes and FLOPs and the hardware
    preset's link speed decide once, before compiling, per residual name, and XLA places
    the copies.
    """
    return Recipe(policy=policy_spelling(capuchin_actions(ctx)), note="swap if hidden")


@register(
    "zero_offload",
    paper="Ren et al. 2021, 'ZeRO-Offload: Democratizing Billion-Scale Model Training' "
    "(USENIX ATC)",
)
def zero_offload(ctx: Context) -> Recipe:
    """Optimizer states in host memory, the update on the host CPU.

    Keeps: parameters and activations on the device, gradients down to host, the Adam
    update on the host (no optimizer state crosses the link), new parameters back up.
    Differs: the update is XLA's own code under ``compute_on("device_host")`` (``host_opt``
    placement), not DeepSpeed's vectorised CPU Adam, and it starts after the whole backward
    pass, where ZeRO-Offload moves gradients and overlaps the transfers with backward. Not
    done: the one-step delayed parameter update; partitioning across data-parallel ranks.
    """
    return Recipe(policy="none", placement="host_opt")


@register(
    "zero_infinity",
    paper="Rajbhandari et al. 2021, 'ZeRO-Infinity: Breaking the GPU Memory Wall for "
    "Extreme Scale Deep Learning' (SC)",
)
def zero_infinity(ctx: Context) -> Recipe:
    """Optimizer states and fp32 masters on NVMe, parameters in host memory, fetched layer
    by layer; activation checkpointing.

    Keeps: the three homes (NVMe for states, host for parameters, device for one layer),
    the chunked NVMe update (``jaxoff.paged``), block-level checkpointing. Differs:
    parameters stream one layer ahead (``host_params_stream1``) rather than by ZeRO-3
    partition hooks; the paged update runs on device buffers (on an accelerator
    ZeRO-Infinity runs it on the CPU) after the backward pass. Not done: activation
    checkpoints swapped to host memory (here the block inputs, the scan carry, stay on the
    device: a names-based policy cannot offload the carry); parameters on NVMe;
    memory-centric tiling of large operators; bandwidth-centric partitioning across
    data-parallel ranks.
    """
    return Recipe(policy="full", placement="host_params_stream1", store=True)


@register(
    "l2l",
    paper="Pudipeddi et al. 2020, 'Training Large Neural Networks with Constant Memory "
    "using a New Execution Algorithm' (arXiv:2002.05645)",
)
def l2l(ctx: Context) -> Recipe:
    """Layer-to-layer: parameters in host memory, one layer on the device at a time.

    Keeps: one layer's parameters on device, the next fetched while it computes, the
    optimizer state and update on the host ("eager parameter server"). Differs: the
    update runs after the whole backward pass, not layer by layer as gradients arrive;
    blocks are recomputed in backward (``full``); XLA schedules the fetches.
    """
    return Recipe(policy="full", placement="host_params_stream1")


@register(
    "stronghold",
    paper="Sun et al. 2022, 'STRONGHOLD: Fast and Affordable Billion-Scale Deep Learning "
    "Model Training' (SC)",
)
def stronghold(ctx: Context) -> Recipe:
    """Parameters in host memory with a working window of layers on the device.

    Keeps: a window of layers prefetched ahead, sized to fit: the largest window whose
    parameters fit ``device_mem`` by the planner's profile (default 2). Differs: the window
    is fixed at compile time (STRONGHOLD adapts it at run time) and the update runs on the
    host after the backward pass, where STRONGHOLD's CPU optimizer updates the offloaded
    layers concurrently with the GPU's backward.
    """
    window = 2
    if ctx.device_mem is not None:
        prof, hw = ctx.profile(), ctx.hw()
        plan = Plan.from_actions(prof, {}, params="host", opt="host")  # full remat
        base = evaluate(prof, hw, plan).device_bytes  # two layers' parameters on device
        room = int((hw.device_mem - base) // max(prof.layer_param_bytes, 1))
        window = max(1, min(prof.num_layers, 1 + room))
    return Recipe(policy="full", placement=f"host_params_stream{window}", note=f"window {window}")


@register(
    "fuyou",
    paper="Liao et al. 2024, 'Adding NVMe SSDs to Enable and Accelerate 100B Model "
    "Fine-tuning on a Single GPU' (Fuyou)",
)
def fuyou(ctx: Context) -> Recipe:
    """NVMe-paged optimizer update inside the backward layer scan, layer by layer.

    Keeps: each layer's optimizer update, with its state paged from NVMe, runs inside the
    backward layer scan as soon as that layer's gradients exist; only one layer's gradients
    exist at a time. The scan is software-pipelined: layer j's backward and layer j + 1's
    update have no data path between them (checked on the traced program). Differs: the
    update runs in the compiled program, not on the host CPU beside a GPU's backward (how
    close the step comes to its bound: ``bench/fuyou.py``, docs/benchmarks.md). Not done: Fuyou's
    activation swapping to SSD (activations stay on the device: each block's input, the
    block recomputed) and its automatic choice of how much to swap. The step comes from
    ``jaxoff.strategies.fuyou`` (``make_fuyou_step``, ``fuyou_init``; ``page_params=True``
    also pages the block parameters, as ZeRO-Infinity does), initialised and built as
    ``jaxoff train --strategy fuyou`` builds it: 16-bit blocks held as their bits wherever
    the trainer's step does so (``blocks_as_bits``); gradient clipping is refused there (it
    needs every gradient before any update).
    """
    return Recipe(policy="full", store=True, update_in_backward=True)
