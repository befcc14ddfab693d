"""FSDP2 against DDP on 2 CPU processes: each scenario runs both ways, on the same data and initial weights; each rank saves what it saw.
Launched by `accelerate launch --use_fsdp --fsdp_version 2`: the first scenario is that route (`learn.accelerate()` reads the launcher's
variables); then they are removed, and DDP and explicit FSDP2 requests follow as under torchrun."""
import os, sys, warnings, torch
from pathlib import Path
from fastai.basics import *
from fastai.callback.all import *
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.tensor import DTensor
from fastxtend_accel.core import *
from fastxtend_accel.compiler import *
from fastxtend_accel.cpu_fsdp import cpu_fsdp_accelerator
from fastxtend_accel.fsdp_values import local_bytes
from fastxtend_accel.patching import compiled_graphs
from fastxtend_accel.test_utils import synth_learner_digits, synth_regression_learner, synth_lm_learner, SavedBytes

defaults.callbacks = [cb for cb in defaults.callbacks if cb is not ProgressCallback] # no progress bars in the test logs

out = Path(sys.argv[1])
only = sys.argv[2].split(',') if len(sys.argv) > 2 else None
res = {}
launched = {k: v for k,v in os.environ.items() if k == 'ACCELERATE_USE_FSDP' or k.startswith('FSDP_')}

def accelerate(learn, mode, mixed_precision='no', **kwargs):
    "`learn.accelerate(...)` with DDP, or with an FSDP2 plugin (Accelerate's FSDP2 path forced on CPU, for this test only)"
    kwargs['mixed_precision'] = mixed_precision # explicit: without it, a learner keeps the precision of the last `Accelerator`
    if mode == 'ddp': return learn.accelerate(**kwargs)
    opts = {k: kwargs.pop(k) for k in ('activation_checkpointing', 'micro_bs') if k in kwargs} # `.accelerate()`'s own
    return learn.accelerate(cpu_fsdp_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2), **kwargs),
                            **opts)

def full(t): return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
def params(learn): return [full(p) for p in learn.model.parameters()]
def shards(learn): return [(type(p).__name__, tuple(p.to_local().shape) if isinstance(p, DTensor) else tuple(p.shape)) for p in learn.model.parameters()]
def opt_state(learn): return [{k: full(v) if isinstance(v, Tensor) else v for k,v in s.items()} for s in learn.opt.state_dict()['state']]

def want(name): return only is None or name in only

class SyncSpy(Callback):
    """Record the calls turning FSDP2's gradient reduction off and on, whether it was on at each backward, and
    Accelerate's clip norm before each step"""
    order = 20
    def before_fit(self):
        self.syncs,self.at_backward,self.norms,self.norm_types,m = [],[],[],[],self.learn.model
        if hasattr(m, 'set_requires_gradient_sync'):
            orig = m.set_requires_gradient_sync
            def spy(flag, **kw): self.syncs.append(flag); return orig(flag, **kw)
            m.set_requires_gradient_sync = spy
    def after_backward(self): self.at_backward.append(self.syncs[-1] if self.syncs else True)
    def before_step(self):
        n = self.learn.accelerator.accelerator.clip_grad_norm_(self.learn.model.parameters(), 1e9)
        # the norm of every process's shards: torch 2.9's `.item()` of FSDP2's norm (a DTensor) gave this process's own
        self.norm_types.append(type(n).__name__); self.norms.append(full(n).item())
    def after_fit(self): vars(self.learn.model).pop('set_requires_gradient_sync', None)

# 0. FSDP asked for by the launcher: `accelerate launch --use_fsdp --fsdp_version 2`, and `learn.accelerate()` in the script
if launched:
    learn = synth_regression_learner().accelerate(cpu_fsdp_accelerator(mixed_precision='no'))
    learn.fit(2, 1e-2)
    res['launch'] = dict(params=params(learn), shards=shards(learn), env={k: launched.get(k) for k in ('ACCELERATE_USE_FSDP', 'FSDP_VERSION')})
    for k in launched: del os.environ[k] # the rest asks for FSDP2 explicitly, or not at all

for mode in ('ddp', 'fsdp'):
    r = res[mode] = {}
    # 1. plain fit, two epochs of Adam; what each process holds
    if want('plain'):
        learn = accelerate(synth_regression_learner(), mode)
        learn.fit(2, 1e-2)
        r['plain'] = dict(params=params(learn), shards=shards(learn), losses=[float(l) for l in learn.recorder.losses],
                          model_type=type(learn.model).__name__, opt_state=opt_state(learn),
                          opt_is_model=all(any(p is q for q in learn.model.parameters()) for pl in learn.opt.param_lists for p in pl))

    # 2. an optimizer built on the unsharded parameters by an earlier fit (with Adam state), then accelerated afresh
    if want('stale_opt'):
        learn = accelerate(synth_regression_learner(), 'ddp')
        learn.fit(1, 1e-2)
        accelerate(learn, mode)
        learn.fit(1, 1e-2)
        r['stale_opt'] = dict(params=params(learn), opt_state=opt_state(learn))

    # 3. gradient accumulation (k=2), clipping that bites, and Accelerate's clip norm
    if want('accum'):
        learn = accelerate(synth_regression_learner(), mode, gradient_accumulation_steps=2)
        spy = SyncSpy()
        learn.fit(1, 1e-2, cbs=[spy, GradientClip(max_norm=0.5)])
        r['accum'] = dict(params=params(learn), syncs=spy.syncs, norms=spy.norms, norm_types=spy.norm_types)

    # 3b. micro-batches of 4 items, the global batch of 32 given per process or split (`split_batches`); 'auto'
    if want('micro'):
        r['micro'] = {}
        for split in (False, True, 'accum'): # the global batch per process or split; inside fastai's accumulation
            learn = accelerate(synth_regression_learner(bs=32 if split is True else 16), mode, micro_bs=4,
                               split_batches=split is True)
            spy = SyncSpy()
            learn.fit(1, 1e-2, cbs=[spy] + ([GradientAccumulation(n_acc=64)] if split == 'accum' else []))
            r['micro'][split] = dict(params=params(learn), values=learn.recorder.values, syncs=spy.syncs,
                                     at_backward=spy.at_backward)
        try: accelerate(synth_regression_learner(), mode, micro_bs='auto').fit(1, 1e-2); r['micro']['auto'] = 'trained'
        except ValueError as e: r['micro']['auto'] = str(e)

    # 4. frozen first group, one cycle, then unfrozen with discriminative learning rates, shuffled data
    if want('freeze'):
        learn = accelerate(synth_regression_learner(shuffle=True), mode)
        learn.freeze_to(-1)
        before = params(learn)
        learn.fit_one_cycle(1, 1e-2)
        frozen = params(learn)
        learn.unfreeze()
        learn.fit_one_cycle(2, slice(1e-4, 1e-2))
        r['freeze'] = dict(before=before, frozen=frozen, params=params(learn), lrs=[h['lr'] for h in learn.opt.hypers])

    # 5. bf16: FSDP2's mixed precision policy (DDP: Accelerate's autocast)
    if want('bf16'):
        class DtypeSpy(Callback):
            def before_fit(self): self.dtypes = set(); self.h = self.learn.model[0].register_forward_hook(lambda m,i,o: self.dtypes.add(str(o.dtype)))
            def after_loss(self): self.loss_dtype = str(self.learn.loss.dtype)
            def after_fit(self): self.h.remove()
        learn = accelerate(synth_regression_learner(), mode, mixed_precision='bf16')
        dspy = DtypeSpy()
        learn.fit(2, 1e-2, cbs=dspy)
        r['bf16'] = dict(dtypes=dspy.dtypes, loss_dtype=dspy.loss_dtype, param_dtypes={str(p.dtype) for p in learn.model.parameters()},
                         losses=[float(l) for l in learn.recorder.losses], params=params(learn))

    # 6. memory: parameters + Adam state each process holds, at its peak during a fit
    if want('memory'):
        class MemSpy(Callback):
            def before_fit(self): self.peak = {}
            def after_step(self):
                b = local_bytes(self.learn.model, self.learn.opt)
                if b['total'] > self.peak.get('total', 0): self.peak = b
        learn = accelerate(synth_learner_digits(n=512, bs=32, hidden=256), mode)
        mspy = MemSpy()
        learn.fit(1, 1e-3, cbs=mspy)
        r['memory'] = dict(peak=mspy.peak, after=local_bytes(learn.model, learn.opt), params=params(learn))

    # 7. what users read back: validate, get_preds, predict, ActivationStats, lr_find, collectives
    if want('eval'):
        learn = accelerate(synth_regression_learner(), mode)
        astats = ActivationStats(with_hist=False)
        learn.fit(1, 1e-2, cbs=astats)
        stats = [[(s['mean'], s['std']) for s in layer] for layer in astats.stats]
        with learn.distributed_eval(): # DDP evaluates on each process alone otherwise; a sharded model always on all together
            preds,targs = learn.get_preds()
            vals = learn.validate()
            pred = learn.predict(torch.linspace(-1, 1, 8))
        before = params(learn)
        sugg = learn.lr_find(show_plot=False, num_it=20)
        rank = learn.accelerator.accelerator.process_index
        alone = None
        if rank == 0: # the main process alone: DDP runs its own copy; a sharded model can't run without the others
            try:
                with learn.single_process(): learn.model(torch.zeros(2, 8)); alone = 'ran'
            except RuntimeError as e: alone = str(e)
        learn.barrier()
        r['eval'] = dict(alone=alone, stats=stats, preds=preds, targs=targs, valid=[float(v) for v in vals], pred=pred[0],
                         lr_valley=sugg.valley, lr_restored=all(torch.equal(a, b) for a,b in zip(before, params(learn))),
                         sharded_after=shards(learn),
                         gather=learn.gather(torch.tensor([rank])).tolist(), reduce=learn.reduce(torch.tensor(float(rank)), 'sum').item())

    # 8. save (full weights, from the main process), load (back into the shards), export
    if want('save'):
        learn = accelerate(synth_regression_learner(), mode)
        learn.fit(1, 1e-2)
        learn.path = out/mode
        learn.path.mkdir(exist_ok=True)
        learn.save('model')
        saved,saved_opt = params(learn),opt_state(learn)
        learn.fit(1, 1e-2) # move away, then back
        learn.load('model')
        loaded,loaded_opt,loaded_shards = params(learn),opt_state(learn),shards(learn)
        learn.export(out/mode/'export.pkl')
        x = torch.linspace(-1, 1, 40).view(5, 8)
        with torch.no_grad(): preds = full(learn.model(x))
        r['save'] = dict(saved=saved, loaded=loaded, saved_opt=saved_opt, loaded_opt=loaded_opt, preds=preds, shards=loaded_shards)

    # 9. compiled before sharding
    if want('compile'):
        learn = accelerate(synth_regression_learner(), mode)
        learn.compile()
        g0 = compiled_graphs()
        learn.fit(2, 1e-2)
        r['compile'] = dict(params=params(learn), graphs=compiled_graphs()-g0, shards=shards(learn))
        (out/mode).mkdir(exist_ok=True)
        learn.export(out/mode/'compiled.pkl')

    # 9b. residual blocks' activations recomputed in the backward pass, compiled: applied before the compiled model's
    # first call traces it and before sharding; the weights of the same compiled fit without it
    if want('activations'):
        from fastxtend_accel.activations import is_checkpointed
        from fastxtend_accel.test_utils import BlockNet
        class Seen(Callback):
            def after_batch(self): self.n = sum(map(is_checkpointed, self.learn.model.modules()))
        runs = {}
        for ac in (None, True):
            learn = synth_learner_digits(n=256, bs=16)
            torch.manual_seed(0)
            learn.model = BlockNet(d=32, n=3)
            accelerate(learn, mode, activation_checkpointing=ac).compile()
            learn.fit(1, 1e-2, cbs=[seen := Seen(), saved := SavedBytes()])
            runs[ac] = dict(params=params(learn), shards=shards(learn), during=seen.n, saved=saved.seen[0],
                            plain_after=not any(is_checkpointed(m) for m in learn.model.modules()))
        r['activations'] = dict(kept=runs[None], checkpointed=runs[True])

    # 9c. fastai's AWD-LSTM language model: tied weights, a hidden state carried between batches and reset before each
    # phase (`ModelResetter`, outside the forward), then validated outside the fit (by all processes together, as in it)
    if want('lm'):
        learn = accelerate(synth_lm_learner(), mode)
        learn.fit(2, 1e-2)
        r['lm'] = dict(params=params(learn), values=learn.recorder.values) # (`validate` gives the `Recorder` new ones)
        with learn.distributed_eval(): r['lm']['valid'] = [float(v) for v in learn.validate()]
        r['lm']['kinds'] = sorted({type(p).__name__ for p in learn.model.parameters()})

# 10. FSDP asked for through the environment variables alone (as `accelerate config` and the launcher set them)
if want('env'):
    os.environ.update(ACCELERATE_USE_FSDP='true', FSDP_VERSION='2')
    learn = synth_regression_learner().accelerate(cpu_fsdp_accelerator())
    del os.environ['ACCELERATE_USE_FSDP'], os.environ['FSDP_VERSION']
    learn.fit(2, 1e-2)
    res['env'] = dict(params=params(learn), shards=shards(learn))

# 11. no silent fallback: FSDP asked for on CPU processes without the test forcing; version 1
if want('errors'):
    def err(f):
        try: f()
        except Exception as e: return f'{type(e).__name__}: {e}'
    res['errors'] = dict(plugin=err(lambda: synth_regression_learner().accelerate(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))))
    os.environ.update(ACCELERATE_USE_FSDP='true', FSDP_VERSION='2')
    res['errors']['env'] = err(lambda: synth_regression_learner().accelerate())
    os.environ['FSDP_VERSION'] = '1'
    res['errors']['v1'] = err(lambda: synth_regression_learner().accelerate()) # refused before anything is built
    del os.environ['ACCELERATE_USE_FSDP'], os.environ['FSDP_VERSION']
    learn = synth_regression_learner().accelerate() # and DDP again afterwards
    learn.fit(1, 1e-2)
    res['errors']['ddp_after'] = type(learn.model).__name__

# 12. models built in shards (`sharded_init`): each case built as usual and in the block from the same seed, trained alike
if want('sharded'):
    from contextlib import nullcontext
    from fastxtend_accel.sharded_init import sharded_init, pending
    from fastxtend_accel.checkpoint import CheckpointCallback
    from fastxtend_accel.test_utils import synth_tabular_learner, synth_text_learner
    def tensors(learn): return [full(t) for t in (*learn.model.parameters(), *learn.model.buffers())]
    def run(make, fit, sharded, mixed_precision='no', mode='fsdp'):
        with sharded_init() if sharded else nullcontext(): learn = make()
        waiting = pending(learn.model)
        accelerate(learn, mode, mixed_precision)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            fit(learn)
        m = learn.model
        return dict(pending=waiting, tensors=tensors(learn), values=learn.recorder.values,
                    ties=len(list(m.named_parameters(remove_duplicate=False))) - len(list(m.parameters())),
                    kinds=sorted({type(p).__name__ for p in learn.model.parameters()}),
                    notices=[str(x.message) for x in w if 'built in full' in str(x.message)])
    def both(make, fit=lambda l: l.fit(2, 1e-2), **kw): return {s: run(make, fit, s, **kw) for s in (False, True)}
    r = res['sharded'] = {}
    r['learner'] = both(lambda: synth_learner_digits(n=256))
    r['tabular'] = both(lambda: synth_tabular_learner(n=128, bn=True))
    r['tabular_bf16'] = both(lambda: synth_tabular_learner(n=128, bn=True), mixed_precision='bf16') # BatchNorm: fp32
    r['bf16'] = both(lambda: synth_learner_digits(n=256), mixed_precision='bf16') # a classifier: fp32 outputs
    r['compiled'] = both(lambda: synth_learner_digits(n=256).compile())
    r['ddp'] = both(lambda: synth_learner_digits(n=256), mode='ddp') # not sharded: built in full, with a notice
    def tied():
        learn = synth_learner_digits(n=256)
        m = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        m[2].weight = m[0].weight # one parameter in two layers
        learn.model = m
        return learn
    r['tied'] = both(tied)
    r['lm'] = both(lambda: synth_lm_learner()) # fastai's language model: its encoder and decoder share a weight
    # a pretrained-style file (another seed's weights): `learn.load` before the first fit keeps each process's rows
    pre = out/'pretrained.pth'
    if int(os.environ['RANK']) == 0: torch.save(synth_text_learner(n=96, seed=1).model.state_dict(), pre)
    torch.distributed.barrier()
    def loaded(learn):
        learn.load(pre.with_suffix(''))
        learn.fit(0) # sharded (and filled) at the start of a fit
        r.setdefault('text_start', []).append({n: full(p) for n,p in learn.model.named_parameters()})
        learn.fit(1, 1e-2)
    r['text_loaded'] = both(lambda: synth_text_learner(n=96), loaded)
    r['text_file'] = torch.load(pre)
    # checkpointed, then resumed by a learner built in the block again: as 2 epochs straight
    ck = out/'sharded_ckpt'
    straight = run(lambda: synth_learner_digits(n=256), lambda l: l.fit(2, 1e-2), True)
    run(lambda: synth_learner_digits(n=256), lambda l: l.fit(1, 1e-2, cbs=CheckpointCallback(ck)), True)
    resumed = run(lambda: synth_learner_digits(n=256), lambda l: l.fit(2, 1e-2, cbs=CheckpointCallback(ck, resume=True)),
                  True)
    r['resume'] = dict(straight=straight, resumed=resumed)
    # refused: processes seeded apart before the block would hold shards of different models
    dls = synth_learner_digits(n=64).dls
    set_seed(int(os.environ['RANK']))
    with sharded_init(): learn = Learner(dls, nn.Linear(64, 10), loss_func=nn.CrossEntropyLoss())
    try: accelerate(learn, 'fsdp').fit(1)
    except Exception as e: r['seeds_apart'] = str(e)
    # refused: loading on the main process only (last: the plugin leaves it in the environment for the next ones)
    def ram_efficient(learn):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
        try: learn.accelerate(cpu_fsdp_accelerator(fsdp_plugin=plugin, mixed_precision='no')).fit(1)
        except Exception as e: return str(e)
        finally: os.environ.pop('FSDP_CPU_RAM_EFFICIENT_LOADING', None)
    with sharded_init(): learn = synth_learner_digits(n=256)
    r['ram_efficient'] = ram_efficient(learn)

rank = int(os.environ.get('RANK', 0))
torch.save(res, out/f'rank{rank}.pt')
