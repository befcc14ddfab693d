"""The supported versions: `pyproject.toml`, the import-time gate (`fastxtend_accel.patching`) and the version matrix
(`tools/matrix.sh`, `.ci/matrix-*.txt`) agree, and a fastai release that renamed a method the library replaces is refused at
import with the library's message. The matrix itself runs in tools/test.sh."""
import os, re, shutil, subprocess, sys, tomllib
from pathlib import Path
import fastai
from packaging.version import Version
import fastxtend_accel.all
from fastxtend_accel.patching import supported, tested, requirement, fastai_api, missing_fastai_api
from fastxtend_accel.extension import fastai_changes
from fastai.learner import Learner

ROOT = Path(__file__).parents[1]

def _pins(f): return dict(l.split('==') for l in (ROOT/f).read_text().splitlines() if '==' in l and not l.startswith('#'))

def test_pyproject_claims_what_the_gate_checks():
    deps = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['dependencies']
    for p in supported: assert requirement(p) in deps, (p, deps)

def _python(f): return [l for l in (ROOT/f).read_text().splitlines() if l.startswith('# python:')]

def test_matrix_cells_are_the_ends_of_each_range():
    low,high,main = _pins('.ci/matrix-low.txt'),_pins('.ci/matrix-high.txt'),_pins('.ci/constraints.txt')
    for p,(lo,_) in supported.items(): assert low[p] == (lo if lo.count('.') == 2 else lo + '.0'), (p, low[p], lo)
    assert {p: main[p] for p in supported} == tested # the main stack: the newest, but for fastcore
    assert {p: high[p] for p in ('torch', 'fastai', 'accelerate')} == {p: tested[p] for p in ('torch', 'fastai', 'accelerate')}
    assert Version(high['fastcore']) >= Version(tested['fastcore'])
    assert (_python('.ci/matrix-low.txt'),_python('.ci/matrix-high.txt')) == (['# python: 3.10'],['# python: 3.12'])

def test_gate_covers_every_fastai_callable_replaced():
    listed = {f"{k.replace(':', '.')}.{n}" for k,names in fastai_api.items() for n in names}
    listed |= {f"fastai.learner.Learner.{n}" for k,names in fastai_api.items() if k.endswith(':Learner') for n in names}
    # what replaces a callable of fastai's: not the names this library adds (an extended learner's `start_from`...)
    changed = {f'{t}.{n}' for t,n,_,when in fastai_changes() if t.startswith('fastai') and not when.startswith('added')
               and (t != 'fastai.learner.Learner' or hasattr(Learner, n))}
    assert changed - listed == set()
    assert missing_fastai_api() == []

def _fastai_copy(tmp_path, rename=None):
    "fastai's installed package copied under `tmp_path`, as release 2.8.99, with `Learner.<old>` renamed `<new>` if asked"
    dst = tmp_path/'fastai'
    shutil.copytree(Path(fastai.__file__).parent, dst, ignore=shutil.ignore_patterns('__pycache__'))
    init = dst/'__init__.py'
    init.write_text(re.sub(r"__version__ = ['\"][^'\"]+['\"]", "__version__ = '2.8.99'", init.read_text()))
    if rename:
        old,new = rename
        src = (dst/'learner.py').read_text()
        assert src.count(f'def {old}(') == 1
        (dst/'learner.py').write_text(src.replace(f'def {old}(', f'def {new}(').replace(f'self.{old}(', f'self.{new}('))
    return tmp_path

def _run(path, code):
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=path,
                          env={**os.environ, 'PYTHONPATH': str(path)})

FIT = ("from fastai.basics import *\nimport fastai\nfrom fastxtend_accel.core import *\n"
       "from fastxtend_accel.test_learners import synth_learner_digits\n"
       "learn = synth_learner_digits(n=64).accelerate()\nlearn.fit(1)\nprint('fitted with fastai', fastai.__version__)")

def test_new_fastai_release_trains(tmp_path):
    "The copy itself is a working fastai 2.8.99: what the next test refuses is the rename, not the copy"
    res = _run(_fastai_copy(tmp_path), FIT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'fitted with fastai 2.8.99' in res.stdout

def test_renamed_method_refused_at_import(tmp_path):
    res = _run(_fastai_copy(tmp_path, ('_do_one_batch', '_do_batch')), FIT)
    assert res.returncode == 1 and 'fitted' not in res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: fastxtend_accel replaces or calls fastai's fastai.learner.Learner._do_one_batch, "
                           "which fastai 2.8.99 lacks (renamed or removed)"), last
    assert f'`pip install fastai=={tested["fastai"]}`' in last
    assert 'AttributeError' not in res.stderr
