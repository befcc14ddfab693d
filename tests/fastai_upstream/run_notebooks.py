"""Run the vendored test cells of fastai's notebooks (this folder's `NN_name.py` files) in this process, and print as JSON,
for each notebook, every cell's error (null if it passed). With `--lib`, `fastxtend_accel.all` is imported first; with `--accelerated` too, and every learner of fastai's
`synth_learner` is accelerated (`.accelerate()`, one process).

    python run_notebooks.py [--lib | --accelerated] 13a_learner.py 13b_metrics.py ..."""
import contextlib, io, json, re, sys, warnings
from pathlib import Path

def cells(path:Path)->list:
    "The code between `# %%` markers: the prelude first, then the notebook's test cells"
    return [c for c in re.split(r'^# %%.*\n', path.read_text(), flags=re.M) if c.strip()]

def run(path:Path)->list:
    "Run the prelude (it must pass), then each cell in the same namespace; each cell's error or None"
    from fastcore.basics import defaults
    old = list(defaults.callbacks) # 13a's prelude changes them, as fastai's notebook does
    prelude,*rest = cells(path)
    ns = {'__name__': '__main__'}
    exec(compile(prelude, f'{path.name}:prelude', 'exec'), ns)
    res = []
    for i,c in enumerate(rest):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                exec(compile(c, f'{path.name}:cell{i}', 'exec'), ns)
            res.append(None)
        except BaseException as e: res.append(f'{type(e).__name__}: {str(e)[:300]}')
    defaults.callbacks = old
    return res

if __name__ == '__main__':
    warnings.filterwarnings('ignore')
    accelerated = [] # the learners `--accelerated` made
    args = sys.argv[1:]
    if args[0] in ('--lib', '--accelerated'):
        import fastxtend_accel.all
        if args[0] == '--accelerated':
            import fastai.test_utils as tu
            plain = tu.synth_learner
            def synth_learner(*a, **kw):
                accelerated.append(1)
                return plain(*a, **kw).accelerate()
            tu.synth_learner = synth_learner
        args = args[1:]
    from fastai.learner import Learner
    res = {Path(p).stem: run(Path(p)) for p in args}
    print(json.dumps(dict(fit_module=Learner.fit.__module__, cells=res, accelerated=len(accelerated))))
