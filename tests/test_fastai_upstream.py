"fastai's own tests of its data, learner, metrics and callbacks (tests/fastai_upstream/) pass with the library too."
import json, sys
from pathlib import Path
from fastxtend_accel.test_utils import start_cmd

UPSTREAM = Path(__file__).parent/'fastai_upstream'
NOTEBOOKS = sorted(UPSTREAM.glob('[0-9]*.py'))
# cells passing on stock fastai here (of 20, 59, 10, 9, 66, 36, 16, 7): the comparison means something only if they run
MIN_PASSING = {'02_data.load': 16, '03_data.core': 58, '06_data.block': 7, '13_callback.core': 9, '13a_learner': 66,
               '13b_metrics': 33, '17_callback.tracker': 16, '18a_callback.training': 7}

def _results(procs):
    res = []
    for p in procs:
        out = p.communicate(timeout=300)[0].decode()
        assert p.returncode == 0, out[-3000:]
        res.append(json.loads(out.strip().splitlines()[-1]))
    return res

def test_fastai_notebooks_pass_with_the_library(tmp_path):
    """Every cell of fastai's notebooks that passes on stock fastai passes after `import fastxtend_accel.all`, and with
    every learner of fastai's `synth_learner` accelerated (one process): `GradientAccumulation` included"""
    assert [p.stem for p in NOTEBOOKS] == list(MIN_PASSING)
    procs = [] # all at once, each in a folder of its own (the cells save models and files)
    for flag in ([], ['--lib'], ['--accelerated']):
        d = tmp_path/(flag[0][2:] if flag else 'stock')
        d.mkdir()
        procs.append(start_cmd([sys.executable, UPSTREAM/'run_notebooks.py', *flag, *NOTEBOOKS], cwd=d))
    stock,lib,accelerated = _results(procs)
    # a plain learner runs fastai's code, imported or not; 20 learners of `synth_learner` accelerated
    assert stock['fit_module'] == lib['fit_module'] == accelerated['fit_module'] == 'fastai.learner'
    assert accelerated['accelerated'] >= 20 and lib['accelerated'] == stock['accelerated'] == 0
    for nb,min_passing in MIN_PASSING.items():
        passing = [i for i,err in enumerate(stock['cells'][nb]) if err is None]
        assert len(passing) >= min_passing, f"{nb}: {len(passing)} cells pass on stock fastai: {stock['cells'][nb]}"
        for name,res in (('the library', lib), ('accelerated learners', accelerated)):
            broken = {i: res['cells'][nb][i] for i in passing if res['cells'][nb][i] is not None}
            assert not broken, f'{nb}: cells that pass on stock fastai fail with {name}: {broken}'
