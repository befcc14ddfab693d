"""FSDP2 through Accelerate for fastai: parameters, gradients and optimizer state sharded across processes, full weights where users expect them"""

# PROTOTYPE of nbs/NN_fsdp.ipynb -> fastxtend_accel/fsdp.py (one `# %%` per notebook cell)

# %% imports
from __future__ import annotations
import os, weakref
from contextlib import contextmanager
from functools import partial
from itertools import chain

import torch
import torch.distributed as dist
from torch import nn
from fastcore.basics import patch
from fastcore.meta import delegates
from fastai.basics import *
from fastai.callback.hook import Hook
from copy import deepcopy
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from .patching import kept, accelerate_state, reset_accelerate_state

# %% auto #0
__all__ = ['build_accelerator', 'check_accelerator', 'is_fsdp2', 'is_sharded', 'prepare_fsdp', 'reshard', 'forward_refused', 'local_bytes', 'gathered']

# %% version gate
_min_torch = '2.6' # `torch.distributed.fsdp.fully_shard` public, `distribute_tensor(src_data_rank=)`, Accelerate's FSDP2 minimum
_has_fsdp2 = ismin_torch(_min_torch)
if _has_fsdp2:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor
else: FSDPModule = DTensor = type('_Missing', (), {}) # nothing is ever an instance

# %% what the user asked for
def _env_flag(name): return os.environ.get(name, 'false').lower() == 'true' # how Accelerate reads its launch flags

_deepspeed_msg = ("fastxtend_accel does not support DeepSpeed: Accelerate's DeepSpeed path replaces fastai's optimizer and needs "
    "`transformers`. To shard parameters, gradients and optimizer state across processes (as ZeRO-3 does), use FSDP2: "
    "`learn.accelerate(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))`, or `accelerate launch --use_fsdp --fsdp_version 2`, "
    "or choose FSDP (version 2) instead of DeepSpeed in `accelerate config`.")

def _refuse_deepspeed(kwargs):
    if kwargs.get('deepspeed_plugin') is not None or kwargs.get('deepspeed_plugins') is not None: raise ValueError(_deepspeed_msg)
    if _env_flag('ACCELERATE_USE_DEEPSPEED'):
        raise ValueError(_deepspeed_msg + " (ACCELERATE_USE_DEEPSPEED=true is set, by `accelerate launch --use_deepspeed` or your `accelerate config`: unset it.)")

def _fsdp_requested(kwargs):
    "Whether `Accelerator(**kwargs)` is asked for FSDP, by an argument or by `accelerate launch`/`accelerate config`"
    return kwargs.get('fsdp_plugin') is not None or _env_flag('ACCELERATE_USE_FSDP')

def is_fsdp2(acc:Accelerator # Any accelerator
            )->bool:
    "Whether `acc` shards models with FSDP2"
    return acc.distributed_type == DistributedType.FSDP and getattr(acc.state.fsdp_plugin, 'fsdp_version', 1) == 2

# %% refusing a silent fallback
def _fsdp_error(acc):
    "Why `acc` does not run FSDP2, and what to do, or None when it does"
    if is_fsdp2(acc): return None
    if acc.distributed_type == DistributedType.FSDP:
        return ("fastxtend_accel supports FSDP version 2 only, and Accelerate's `FullyShardedDataParallelPlugin` defaults to version 1: "
                "pass `FullyShardedDataParallelPlugin(fsdp_version=2, ...)`, launch with `--fsdp_version 2`, or set `fsdp_version: 2` in `accelerate config`.")
    if acc.num_processes == 1:
        return ("FSDP was requested, but this is a single process: FSDP shards a model across several processes. Launch several "
                "(`accelerate launch --num_processes N`, `torchrun --nproc_per_node N`), or drop the FSDP request to train on one.")
    return (f"FSDP was requested, but Accelerate set up {acc.distributed_type.value} on {acc.device.type}: Accelerate runs FSDP only on GPUs "
            "(and other accelerator devices), and on CPU processes it trains plain, unsharded DDP without a warning. Run on GPUs, "
            "or drop the FSDP request (the `fsdp_plugin` argument, `--use_fsdp`, ACCELERATE_USE_FSDP, or FSDP in `accelerate config`) to train with DDP.")

_force_cpu_fsdp = False # set by `_forced_cpu_fsdp` only

@contextmanager
def _forced_cpu_fsdp():
    "TESTS ONLY: inside, an FSDP request on CPU processes runs Accelerate's real FSDP2 path instead of its silent DDP fallback"
    global _force_cpu_fsdp
    prev,_force_cpu_fsdp = _force_cpu_fsdp,True
    try: yield
    finally: _force_cpu_fsdp = prev

def _force_fsdp(acc, plugin):
    "What Accelerate's state does for FSDP on GPUs, done on CPU processes (both shared states: a new `AcceleratorState` copies `PartialState`'s)"
    plugin = plugin or FullyShardedDataParallelPlugin() # as Accelerate builds it from the environment
    PartialState._shared_state['distributed_type'] = DistributedType.FSDP
    acc.state.distributed_type,acc.state.fsdp_plugin = DistributedType.FSDP,plugin
    if acc.mixed_precision != 'no': plugin.set_mixed_precision(acc.mixed_precision)

def check_accelerator(acc:Accelerator # A ready accelerator, passed to `Learner.accelerate`
                     ):
    "Raise unless `acc` is one fastxtend_accel trains with: no DeepSpeed, FSDP version 2 only, and no DDP where FSDP was asked for"
    if acc.distributed_type == DistributedType.DEEPSPEED: raise ValueError(_deepspeed_msg)
    # Accelerate sets ACCELERATE_USE_FSDP when given a plugin, also where it then falls back to DDP
    if acc.distributed_type == DistributedType.FSDP or _env_flag('ACCELERATE_USE_FSDP'):
        msg = _fsdp_error(acc)
        if msg: raise ValueError(msg)

# %% building the accelerator
def build_accelerator(**kwargs # Passed to `Accelerator`
                     )->Accelerator:
    "`Accelerator(**kwargs)`, refusing DeepSpeed, and raising unless a request for FSDP (argument, launcher, `accelerate config`) gets FSDP2"
    _refuse_deepspeed(kwargs)
    fsdp = _fsdp_requested(kwargs)
    # Accelerate's state is a per-process singleton: a new plugin, or DDP after FSDP, needs it afresh
    if fsdp and not _has_fsdp2: raise ImportError(f"FSDP2 needs torch>={_min_torch} (found {torch.__version__}): `pip install -U 'torch>={_min_torch}'`")
    if fsdp or accelerate_state('distributed_type') == DistributedType.FSDP: reset_accelerate_state(partial=True)
    env = os.environ.get('ACCELERATE_USE_FSDP')
    try: acc = Accelerator(**kwargs)
    finally: # Accelerate sets it when given a plugin, and every later `Accelerator` in the process would read it
        if env is None: os.environ.pop('ACCELERATE_USE_FSDP', None)
        else: os.environ['ACCELERATE_USE_FSDP'] = env
    if fsdp and _force_cpu_fsdp and acc.distributed_type == DistributedType.MULTI_CPU: _force_fsdp(acc, kwargs.get('fsdp_plugin'))
    if fsdp and (msg := _fsdp_error(acc)): raise ValueError(msg)
    return acc

# %% sharding the model, moving the optimizer
def is_sharded(model:nn.Module # Any module
              )->bool:
    "Whether `model` was sharded with FSDP2's `fully_shard`"
    return isinstance(model, FSDPModule)

def reshard(model:nn.Module # A module sharded with FSDP2
           )->nn.Module:
    "Free the full parameters FSDP2 keeps after a forward without backward (the root module keeps them), and return `model`"
    for m in model.modules():
        if isinstance(m, FSDPModule): m.reshard()
    return model

class _ParamsView(torch.optim.Optimizer):
    "Parameters as a torch `Optimizer` that is never stepped, so Accelerate's FSDP2 `prepare` tells which sharded parameter replaces each"
    def __init__(self, params): super().__init__([{'params': params}], {})
    def step(self, closure=None): raise NotImplementedError("only used to prepare a model with FSDP2")

def _broadcast(model):
    "Give every process the main process's parameters and buffers, as DDP does when it wraps a model"
    with torch.no_grad():
        for t in chain(model.parameters(), model.buffers()): dist.broadcast(t.data, 0)

def _meta(t):
    m = torch.empty_like(t, device='meta')
    return nn.Parameter(m, t.requires_grad) if isinstance(t, nn.Parameter) else m

def _meta_copy(model):
    "A copy of `model` on the meta device: its classes and structure, none of its memory, uncompiled, without the hooks of fastai callbacks"
    memo = {id(t): _meta(t) for t in chain(model.parameters(), model.buffers())}
    for m in model.modules():
        for k,d in vars(m).items():
            if k.endswith('hooks') and isinstance(d, dict):
                memo[id(d)] = type(d)((i,h) for i,h in d.items() if not isinstance(getattr(h, '__self__', None), Hook))
        if m._compiled_call_impl is not None: memo[id(m._compiled_call_impl)] = None
    res = deepcopy(model, memo)
    for m in res.modules():
        if isinstance(vars(m).get('forward'), partial): del m.forward # compiled with `compile_model(hooks=False)`
    return res

_skeletons = weakref.WeakKeyDictionary() # sharded model -> its unsharded copy on the meta device, for `save`, `load` and `export`

def _shard_like(t, p, src=0):
    "`t`, a full tensor of `p`'s shape, as a `DTensor` laid out as `p`; from process `src` (None: each process's own `t`)"
    return distribute_tensor(t.detach().to(p.device), p.device_mesh, p.placements, src_data_rank=src)

def _shard_state(state, p, src=0):
    "Optimizer state `state` of parameter `p`, its full tensors of `p`'s shape sharded like `p`"
    return {k: _shard_like(v, p, src) if isinstance(v, Tensor) and not isinstance(v, DTensor) and v.shape == p.shape else v
            for k,v in sorted(state.items())}

def _states(opt):
    "The dicts holding `opt`'s per-parameter state: fastai's, and the torch optimizer's inside an `OptimWrapper`"
    return [opt.state] + ([opt.opt.state] if isinstance(opt, OptimWrapper) else [])

def _move_opt(opt, new):
    "Point fastai optimizer `opt` at the sharded parameters `new[p]` instead of its `p`, its state sharded alike"
    if isinstance(opt, OptimWrapper):
        for pg in opt.opt.param_groups: pg['params'] = [new[p] for p in pg['params']]
    else: opt.param_lists = L(L(new[p] for p in pl) for pl in opt.param_lists)
    for st in _states(opt):
        moved = {new.get(p, p): _shard_state(s, new.get(p, p)) for p,s in st.items()}
        st.clear(); st.update(moved)

def _opt_params(opt): return [p for pl in opt.param_lists for p in pl]

def _track(acc, model):
    "Have `acc` know `model` as prepared again (`release_prepared` dropped it after the last fit): `save_state` and `clip_grad_norm_` look there"
    if not any(m is model for m in acc._models): acc._models.append(model) # the list is not public

def _prepare(acc, model, params):
    "Shard `model` through Accelerate's FSDP2 `prepare`, and the sharded parameters that replace `params`, in order"
    model,view = acc.prepare(model, _ParamsView(params)) # Accelerate's FSDP2 contract: model and optimizer together
    acc._optimizers.remove(view) # a stand-in: fastai's optimizer steps, and `AcceleratorCallback` prepares it (the list is not public)
    return model,view.param_groups[0]['params']

def _skeleton(model):
    if model not in _skeletons:
        raise ValueError("This model was sharded outside fastxtend_accel, which can't rebuild it unsharded: let `learn.accelerate(fsdp_plugin=...)` shard it.")
    return _skeletons[model]

def prepare_fsdp(acc:Accelerator, # An accelerator running FSDP2
                 model:nn.Module, # The learner's model, plain or already sharded
                 opt=None # The learner's fastai optimizer, if built
                )->nn.Module:
    "`model` sharded with Accelerate's FSDP2 the first time, and `opt` moved onto its sharded parameters, state included"
    if is_sharded(model):
        reshard(model)
        _track(acc, model)
    else:
        if not acc.state.fsdp_plugin.cpu_ram_efficient_loading: _broadcast(model) # with it, Accelerate broadcasts itself
        skeleton = _meta_copy(model)
        old = list({id(p): p for p in (_opt_params(opt) if opt is not None else model.parameters())}.values())
        model,new = _prepare(acc, model, old)
        _skeletons[model] = skeleton
        if opt is not None: _move_opt(opt, dict(zip(old, new)))
    if opt is not None:
        ids = {id(p) for p in model.parameters()}
        stale = [p for p in _opt_params(opt) if id(p) not in ids]
        if stale: raise ValueError(f"`learn.opt` steps {len(stale)} parameter(s) that are not the sharded model's, and would update them "
                                   "for nothing: call `learn.create_opt()` to build an optimizer on the sharded parameters.")
    return model

def _refuse(m, args):
    raise RuntimeError("The model is sharded with FSDP2: it runs only on every process together, never on one alone (it would wait "
                       "forever for the others). Run it on every process, outside `main_process_only` and `Learner.single_process`.")

@contextmanager
def forward_refused(model:nn.Module # A module sharded with FSDP2
                   ):
    "Inside, calling `model` raises at once instead of waiting forever in FSDP2's gathers for processes that don't call it"
    h = model.register_forward_pre_hook(_refuse, prepend=True) # before FSDP2's own hook, which gathers
    try: yield
    finally: h.remove()

# %% measuring
def local_bytes(model:nn.Module, # A model, sharded or not
                opt=None # Its fastai optimizer
               )->dict:
    "Bytes of parameters and optimizer state this process holds (its shards only, under FSDP2)"
    loc = lambda t: t.to_local() if isinstance(t, DTensor) else t
    nb = lambda ts: sum(loc(t).numel()*t.element_size() for t in ts)
    params = nb(model.parameters())
    state = 0 if opt is None else nb(v for st in _states(opt) for s in st.values() for v in s.values() if isinstance(v, Tensor))
    return dict(params=params, opt=state, total=params+state)

# %% full values from a sharded model
def _full(t): return t.full_tensor() if isinstance(t, DTensor) else t

def _main(): return not dist.is_initialized() or dist.get_rank() == 0

def _unsharded_model(model):
    "A plain copy of sharded `model` holding its full weights on the main process, None elsewhere; every process must call it"
    skeleton = _skeleton(model)
    reshard(model)
    main = _main()
    res = deepcopy(skeleton) if main else None
    new = {}
    for n,t in chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)):
        if id(t) not in new:
            v = _full(t).detach() # gathers: every process, in the same order
            if not main: continue
            new[id(t)] = nn.Parameter(v.cpu(), t.requires_grad) if isinstance(t, nn.Parameter) else v.cpu()
        if main:
            mod,_,attr = n.rpartition('.')
            m = res.get_submodule(mod)
            (m._parameters if attr in m._parameters else m._buffers)[attr] = new[id(t)]
    return res

def _full_states(opt):
    "`opt`'s per-parameter state dicts with full tensors, on the main process (None elsewhere); every process must call it"
    res = []
    for st in _states(opt):
        full = {p: {k: _full(v) for k,v in sorted(s.items())} for p,s in st.items()}
        res.append({p: {k: v.cpu() if isinstance(v, Tensor) else v for k,v in s.items()} for p,s in full.items()})
    return res if _main() else None

@contextmanager
def _swapped(learn, model, states):
    "Inside, `learn.model` is `model` and `learn.opt`'s state dicts hold `states`; afterwards both as they were, `learn.opt` the same object"
    old_model,opt = learn.model,learn.opt
    old = [dict(st) for st in _states(opt)] if states is not None else None
    learn.model = model
    if states is not None:
        for st,s in zip(_states(opt), states): st.clear(); st.update(s)
    try: yield
    finally:
        learn.model,learn.opt = old_model,opt
        if states is not None:
            for st,s in zip(_states(opt), old): st.clear(); st.update(s)

@contextmanager
def gathered(learn:Learner, # A learner whose model may be sharded with FSDP2
             with_opt:bool=False # Gather the optimizer state too
            ):
    "Inside, on the main process, `learn.model` is a plain copy with the full weights (and `learn.opt` has full state); every process must enter"
    if not is_sharded(learn.model):
        yield
        return
    model = _unsharded_model(learn.model)
    states = _full_states(learn.opt) if with_opt and learn.opt is not None else None
    if model is None: # not the main process: nothing to swap
        yield
        return
    with _swapped(learn, model, states): yield

# %% save, load, export
_save,_load,_export = [kept(Learner, n, 'pre_fsdp') for n in ('save', 'load', 'export')]

@patch
@delegates(_save)
def save(self:Learner, file, **kwargs):
    "Save model and optimizer state to `self.path/self.model_dir/file`; an FSDP2-sharded model as full weights, from the main process"
    with gathered(self, kwargs.get('with_opt', True)): return _save(self, file, **kwargs)

@patch
@delegates(_load)
def load(self:Learner, file, device=None, **kwargs):
    "Load model and optimizer state from `self.path/self.model_dir/file`; into an FSDP2-sharded model, each process keeping its shards"
    model = self.model
    if not is_sharded(model): return _load(self, file, device=device, **kwargs)
    if self.opt is None: self.create_opt() # on the sharded parameters
    reshard(model)
    plain = deepcopy(_skeleton(model)).to_empty(device='cpu')
    with _swapped(self, plain, None): _load(self, file, device=device, **kwargs) # every process reads the file
    src = dict(chain(plain.named_parameters(), plain.named_buffers()))
    with torch.no_grad():
        for n,t in chain(model.named_parameters(), model.named_buffers()):
            t.copy_(_shard_like(src[n], t, None) if isinstance(t, DTensor) else src[n])
    for st in _states(self.opt):
        for p in list(st): st[p] = _shard_state(st[p], p, None)
    return self

@patch
@delegates(_export)
def export(self:Learner, fname='export.pkl', **kwargs):
    "Export the content of `self` for inference; an FSDP2-sharded model unsharded, with its full weights, from the main process"
    with gathered(self): _export(self, fname, **kwargs)
