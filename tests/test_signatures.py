"Every fastai function and method the library replaces accepts every call fastai's own accepts, with the same meaning"
import inspect, json, os, re, sys
from pathlib import Path
import pytest
import fastai

_STOCK = 'FASTXTEND_SIGNATURES_STOCK' # set in the process that reads fastai's own signatures
if not os.environ.get(_STOCK): import fastxtend_accel.all

FASTAI = str(Path(fastai.__file__).parent)

def _default(v):
    if v is inspect.Parameter.empty: return None
    if inspect.ismodule(v): return f'module {v.__name__}'
    if hasattr(v, '__qualname__'): return f'{getattr(v, "__module__", "")}.{v.__qualname__}'
    return re.sub(r' at 0x[0-9a-f]+', '', repr(v)) # sentinels like `object()` differ only by address

def _params(f):
    "`f`'s parameters as `[name, kind, default]`, comparable across processes"
    return [[p.name, p.kind.name, _default(p.default)] for p in inspect.signature(f).parameters.values()]

def _where(f): return f'{f.__code__.co_filename}:{f.__code__.co_firstlineno}'

def _functions(mods):
    "The functions defined in modules `mods` and the methods of their classes, by `module:qualname`"
    res = {}
    for m in mods:
        for n,o in list(vars(sys.modules[m]).items()):
            if getattr(o, '__module__', None) != m: continue
            if inspect.isclass(o):
                for k,f in vars(o).items():
                    f = getattr(f, '__func__', f) # classmethods, staticmethods
                    if inspect.isfunction(f): res[f'{m}:{o.__qualname__}.{k}'] = f
            elif inspect.isfunction(o): res[f'{m}:{n}'] = o
    return res

def _stock(mods):
    "The signatures of `_functions(mods)` in a process that imports fastai's modules `mods`, and never fastxtend_accel"
    code = (f"import importlib, json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_signatures as t\n"
            f"mods = {mods!r}\n"
            "for m in mods: importlib.import_module(m)\n"
            "assert not any(m.startswith('fastxtend_accel') for m in sys.modules)\n"
            "print(json.dumps({k: (t._where(f), t._params(f)) for k,f in t._functions(mods).items()}))")
    from fastxtend_accel.test_utils import run_cmd # not at the top: this file is imported where fastxtend_accel must not be
    res = run_cmd([sys.executable, '-c', code], env={_STOCK: '1'})
    return json.loads(res.stdout.splitlines()[-1])

def _current(key):
    "The function now at `key`, or None"
    m,q = key.split(':')
    o = sys.modules[m]
    for a in q.split('.'): o = vars(o).get(a) if inspect.isclass(o) else getattr(o, a, None)
    o = getattr(o, '__func__', o)
    return o if inspect.isfunction(o) else None

def problems(stock, new):
    "The calls `stock` accepts that `new` refuses or reads differently; `[]` if none"
    res,names = [],{q[0]: q for q in new}
    pos = [p for p in stock if p[1] in ('POSITIONAL_ONLY', 'POSITIONAL_OR_KEYWORD')]
    for i,p in enumerate(pos):
        q = new[i] if i < len(new) else None
        if q != p: res.append(f"positional parameter {i} is {p} in fastai, {q} here")
    kinds = {q[1] for q in new}
    for p in stock:
        if p[1] == 'KEYWORD_ONLY':
            if p[0] in names and names[p[0]][2] != p[2]: res.append(f"keyword {p[0]!r} defaults to {names[p[0]][2]}, {p[2]} in fastai")
            elif p[0] not in names and 'VAR_KEYWORD' not in kinds: res.append(f"keyword {p[0]!r} refused")
        if p[1] in ('VAR_POSITIONAL', 'VAR_KEYWORD') and p[1] not in kinds: res.append(f"fastai's {p[1]} {p[0]!r} missing")
    old = {p[0] for p in stock}
    res += [f"new parameter {q[0]!r} is {q[1]}: new parameters must be keyword-only"
            for q in new if q[0] not in old and q[1] in ('POSITIONAL_ONLY', 'POSITIONAL_OR_KEYWORD')]
    return res

def _kept_patches(key, stock):
    "The library's replacements of method `key` that a later patch wraps, kept on the class as `_<tag>_<name>` (a name fastai lacks)"
    m,q = key.split(':')
    cls_name,_,name = q.rpartition('.')
    cls = vars(sys.modules[m]).get(cls_name)
    if not inspect.isclass(cls): return {}
    return {f'{m}:{cls_name}.{a}': f for a,f in vars(cls).items() if a.startswith('_') and a.endswith('_'+name)
            and f'{m}:{cls_name}.{a}' not in stock and inspect.isfunction(f) and 'fastxtend_accel' in f.__code__.co_filename}

def _instead(stock):
    "What runs instead of fastai's once a learner asked: `ExtendedLearner`'s methods and those `note_change` noted"
    from fastxtend_accel.extension import ExtendedLearner, _changes
    res = []
    for a,f in vars(ExtendedLearner).items():
        f = getattr(f, '__func__', f)
        if not inspect.isfunction(f): continue
        names = [n for n in (a, a.split('_', 3)[-1]) if f'fastai.learner:Learner.{n}' in stock] # `_pre_compiler_load`: `load`
        if names: res.append((f'fastai.learner:Learner.{names[0]} (ExtendedLearner.{a})', f'fastai.learner:Learner.{names[0]}', f))
    for (t,n),(f,when) in [(k, v) for k,v in _changes.items() if isinstance(k[0], type)]: # fastai's classes
        key = f'{t.__module__}:{t.__qualname__}.{n}'
        if key in stock: res.append((f'{key} ({when.split(":")[0]})', key, f))
    return res

def _replaced():
    "`(id, fastai's signature, the replacement)` for each fastai function or method the library replaces"
    stock = _stock(sorted(m for m in sys.modules if m.split('.')[0] == 'fastai'))
    res = {k: sig for k,(where,sig) in stock.items() if (f := _current(k)) is not None and _where(f) != where}
    res = {**res, **{a: stock[k][1] for k in res for a in _kept_patches(k, stock)}}
    return [(k, sig, _current(k)) for k,sig in res.items()] + [(i, stock[k][1], f) for i,k,f in _instead(stock)], res

_cases,_global = ([], {}) if os.environ.get(_STOCK) else _replaced()

def test_patches_found():
    "The guard sees the patches it is meant to watch"
    keys = {k.split(' ')[0] for k,*_ in _cases}
    assert {'fastai.learner:Learner.fit', 'fastai.learner:Learner.load', 'fastai.learner:Learner.export',
            'fastai.learner:Learner.fine_tune', 'fastai.optimizer:Optimizer.step', 'fastai.learner:Recorder.after_batch',
            'fastai.data.load:DataLoader.create_batches'} <= keys, sorted(keys)

@pytest.mark.parametrize('key,stock,f', _cases, ids=[k for k,*_ in _cases])
def test_signature_kept(key, stock, f):
    assert problems(stock, _params(f)) == []

def test_changes_table():
    "Every fastai callable replaced for everyone is a `global_patch` of the table, with why; the table's rows are real"
    from fastxtend_accel.extension import fastai_changes, ExtendedLearner
    rows = fastai_changes()
    every = {f"{t.rpartition('.')[0]}:{t.rpartition('.')[2]}.{n}" for t,n,m,when in rows if when.startswith('every learner: ')}
    assert set(_global) == every == {'fastai.optimizer:Optimizer.step'}, (sorted(_global), sorted(every))
    asked = {n for t,n,m,when in rows if when.startswith('a learner that asked')}
    assert {'fit', 'one_batch', 'all_batches', 'export', 'load', '_backward', '_call_one', '__call__'} <= asked
    assert all(m and m.startswith('fastxtend_accel.') for t,n,m,when in rows), [r for r in rows if not r[2]]
    added = [(t, n) for t,n,m,when in rows if when.startswith('added')]
    assert ('fastai.learner.Learner', 'accelerate') in added and ('fastai.learner.Learner', 'compile') in added

def test_problems_found():
    "What the guard reports for a wrong patch"
    stock = [['self', 'POSITIONAL_OR_KEYWORD', None], ['a', 'POSITIONAL_OR_KEYWORD', '1'], ['b', 'KEYWORD_ONLY', '2']]
    assert problems(stock, stock) == []
    assert problems(stock, stock[:1] + [['new', 'POSITIONAL_OR_KEYWORD', '0']] + stock[1:]) == [
        "positional parameter 1 is ['a', 'POSITIONAL_OR_KEYWORD', '1'] in fastai, ['new', 'POSITIONAL_OR_KEYWORD', '0'] here",
        "new parameter 'new' is POSITIONAL_OR_KEYWORD: new parameters must be keyword-only"]
    assert problems(stock, stock[:1] + [['kwargs', 'VAR_KEYWORD', None]]) == [
        "positional parameter 1 is ['a', 'POSITIONAL_OR_KEYWORD', '1'] in fastai, ['kwargs', 'VAR_KEYWORD', None] here"]

def _two_groups(m): return [list(m[0].parameters()), list(m[2].parameters())]

def test_stock_positional_calls(tmp_path):
    "The calls of issue 11, positional as fastai allows them, mean what they mean in fastai"
    import pickle
    import fastai.learner
    from fastai.basics import Callback
    from fastxtend_accel.test_utils import synth_learner_digits
    learn = synth_learner_digits(n=128, path=tmp_path, splitter=_two_groups).accelerate() # the library's methods
    learn.save('m')
    assert learn.load('m', 'cpu') is learn
    learn.export('e.pkl', pickle) # `pickle_module`
    assert isinstance(fastai.learner.load_learner(tmp_path/'e.pkl', True), fastai.learner.Learner) # `cpu`
    class MaxLrs(Callback):
        def before_fit(self): self.lrs = [0., 0.]
        def after_batch(self): self.lrs = [max(a, h['lr']) for a,h in zip(self.lrs, self.opt.hypers)]
    rec = MaxLrs()
    with learn.no_bar(), learn.no_logging(): learn.fine_tune(1, 1e-2, 1, 10, cbs=rec) # `lr_mult` 4th
    assert abs(rec.lrs[1]/rec.lrs[0] - 10) < 1e-6, rec.lrs # the float division of two learning rates

def test_plain_fit_runs_fastai_code(tmp_path):
    "With every module imported, learners that never asked (tabular, text, a `DataBlock`, torch loaders) run fastai's code"
    # they fit, evaluate, save and export calling no function of the library but the table's global patch, `Optimizer.step`
    import fastxtend_accel
    from torch.utils.data import TensorDataset, DataLoader as TorchDL
    from fastai.basics import DataLoaders, Learner, CrossEntropyLossFlat, accuracy
    from fastxtend_accel.extension import fastai_changes, ExtendedLearner
    from fastxtend_accel.test_utils import (datablock_learner, synth_tabular_learner, synth_text_learner, digits_tensors,
                                            tiny_mlp)
    x,y = digits_tensors(256)
    torch_dls = DataLoaders(TorchDL(TensorDataset(x[:200], y[:200]), batch_size=32, shuffle=True),
                            TorchDL(TensorDataset(x[200:], y[200:]), batch_size=32))
    learners = [datablock_learner(n=256, path=tmp_path), synth_tabular_learner(path=tmp_path), synth_text_learner(path=tmp_path),
                Learner(torch_dls, tiny_mlp(), loss_func=CrossEntropyLossFlat(), metrics=accuracy, path=tmp_path)]
    lib,called = str(Path(fastxtend_accel.__file__).parent),set()
    def watch(frame, event, arg):
        fixture = any(m in frame.f_code.co_filename for m in ('test_utils', 'test_learners')) # the fixtures' own code
        if event == 'call' and frame.f_code.co_filename.startswith(lib) and not fixture:
            called.add(f'{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}')
    sys.setprofile(watch)
    try:
        for learn in learners:
            with learn.no_bar(), learn.no_logging():
                learn.fit_one_cycle(1, 1e-2)
                learn.validate(); learn.get_preds(dl=learn.dls.valid)
            learn.save('m'); learn.load('m')
            if learn is not learners[-1]: learn.export(tmp_path/'export.pkl') # fastai can't export torch loaders
    finally: sys.setprofile(None)
    assert not any(isinstance(l, ExtendedLearner) for l in learners)
    every = [(t, n) for t,n,m,when in fastai_changes() if when.startswith('every learner')]
    assert every == [('fastai.optimizer.Optimizer', 'step')], every
    # the table's other global change: a hook before `fork` (Python < 3.11.10), for the loaders' worker processes
    hooks = {'collectives._settle_before_fork'} if any(t == 'os' for t,*_ in fastai_changes()) else set()
    assert called - hooks == {'callback.step'}, sorted(called)

_ORDER = """
import importlib, json, sys, tempfile
for m in sys.argv[1].split(','): importlib.import_module(f'fastxtend_accel.{m}')
import fastxtend_accel.all
from fastai.basics import *
from fastxtend_accel.extension import fastai_changes
from fastxtend_accel.loop import learner_file_hooks
from fastxtend_accel.test_utils import synth_learner_digits
set_seed(0)
learn = synth_learner_digits(n=128, bs=32).accelerate().compile(backend='eager')
with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
with tempfile.TemporaryDirectory() as d: learn.export(f'{d}/e.pkl'); cbs = [type(c).__name__ for c in load_learner(f'{d}/e.pkl').cbs]
print(json.dumps(dict(changes=fastai_changes(), hooks=learner_file_hooks(), values=[[float(v) for v in r] for r in learn.recorder.values], exported=cbs)))
"""

def test_import_order_changes_nothing():
    "Modules imported in any order, in fresh processes: the same changes to fastai, file hooks and fit"
    from fastxtend_accel.test_utils import run_cmd
    orders = ['core', 'trackers,checkpoint,compiler', 'compiler,fsdp_values,checkpoint.resume,core',
              'monitors,profiler,watchdog,ema,guard,loop', 'checkpoint.signals,checkpoint,fetching,data,events,callback']
    res = [json.loads(run_cmd([sys.executable, '-c', _ORDER, o]).stdout.splitlines()[-1]) for o in orders]
    assert all(r == res[0] for r in res[1:]), [o for o,r in zip(orders, res) if r != res[0]]
    assert res[0]['exported'] == ['TrainEvalCallback', 'Recorder', 'CastToTensor', 'ProgressCallback'], res[0]['exported']

def test_trackers_after_core_alone(tmp_path):
    "`.accelerate(log_with=...)` after `from fastxtend_accel.core import *` alone sends the fit to TensorBoard"
    code = f"""
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.test_utils import synth_learner_digits
learn = synth_learner_digits(n=128, bs=32).accelerate(log_with='tensorboard', project_dir={str(tmp_path)!r})
with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
print(type(learn.trackers).__module__)
"""
    from fastxtend_accel.test_utils import run_cmd
    assert run_cmd([sys.executable, '-c', code]).stdout.splitlines()[-1] == 'fastxtend_accel.trackers'
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path/'fastai')).Reload()
    assert [e.step for e in ea.Scalars('valid_loss')] == [3] # 102 training items at bs 32, drop_last: 3 steps
