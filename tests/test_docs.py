"The site `bash tools/docs.sh` builds (`_docs/`), in headless Chromium: every page, link, anchor, the search, offline"
import ast, functools, http.server, os, re, shutil, tempfile, threading
from pathlib import Path
from urllib.parse import urlsplit
import pytest

SITE = Path(__file__).parents[1]/'_docs'
CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
_ADDRESS = re.compile(r'<object object at|\bat 0x[0-9a-fA-F]{6,}') # a default's repr with its memory address
_ENTRY = re.compile(r'<p><span id="([^"]+)"></span></p>') # an API entry's anchor (tools/docs.py, before show_doc's)
API = ['accelerate', 'processes', 'compiler', 'checkpoints', 'clusters', 'monitors', 'ema', 'guard', 'activations',
       'microbatch'] # nbs/reference/'s pages of the public API, in the sidebar's order
REFERENCE = API + ['compatibility'] # and what works with what: the compatibility matrix's table
_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
          '--disable-background-networking', '--disable-component-update', '--disable-sync']

pytestmark = pytest.mark.skipif(
    not ((SITE/'index.html').exists() and Path(CHROMIUM).exists()) and not os.environ.get('CI'),
    reason="needs the built site and Chromium: `bash tools/docs.sh --test` builds it, installs Chromium and runs this")

class _Handler(http.server.SimpleHTTPRequestHandler):
    "Serves the site quietly, noting what was asked for and is not there"
    missing = []
    def log_message(self, *args): pass
    def send_error(self, code, *args, **kw):
        if code == 404: self.missing.append(self.path)
        super().send_error(code, *args, **kw)

@pytest.fixture(scope='module')
def base():
    "The site served on 127.0.0.1, as a reader's browser gets it"
    assert (SITE/'index.html').exists(), "no `_docs/index.html`: run `bash tools/docs.sh`"
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(_Handler, directory=str(SITE)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{srv.server_address[1]}/'
    srv.shutdown()

@pytest.fixture(scope='module')
def browser():
    "Debian's Chromium driven by Playwright (which never downloads a browser of its own here)"
    from playwright.sync_api import sync_playwright
    assert Path(CHROMIUM).exists(), "no Chromium: `apt-get install -y chromium` (`tools/docs.sh --test` does)"
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=_FLAGS, headless=True,
                                                   viewport=dict(width=1440, height=1000))
        yield ctx
        ctx.close()

def _pages():
    "Every HTML page of the site, Sphinx's own folders (`_static`) aside"
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.glob('**/*.html')
                  if not p.relative_to(SITE).parts[0].startswith('_'))

def _visit(browser, base, name):
    "Load page `name`: its status, console errors, requests that leave the site, ids, links, HTML and text"
    page,errors,outside = browser.new_page(),[],[]
    page.on('console', lambda m: m.type == 'error' and errors.append(m.text))
    page.on('pageerror', lambda e: errors.append(str(e)))
    def route(r):
        if r.request.url.startswith((base, 'data:')): return r.continue_()
        outside.append(r.request.url)
        r.abort()
    page.route('**/*', route)
    resp = page.goto(base + name, wait_until='load')
    res = dict(status=resp.status, errors=errors, outside=outside, html=page.content(), text=page.inner_text('body'),
               ids=set(page.eval_on_selector_all('[id]', 'es => es.map(e => e.id)')),
               links=page.eval_on_selector_all('a[href]', 'es => es.map(e => e.href)'))
    page.close()
    return res

@pytest.fixture(scope='module')
def visited(base, browser): return {name: _visit(browser, base, name) for name in _pages()}

def test_every_notebook_has_a_page(visited):
    "One page per notebook, named as nbdev names it (`00_core.ipynb` is `core.html`), and the landing page"
    from nbdev.config import get_config, nbpath2html
    from nbdev.doclinks import nbglob
    nbs = get_config().nbs_path
    want = {nbpath2html(Path(p).relative_to(nbs)).as_posix() for p in nbglob(nbs)}
    assert 'index.html' in want and want <= set(visited), sorted(want - set(visited))

def _sidebar(html):
    "The sidebar's sections: each caption's pages, in order"
    parts = re.split(r'<span class="caption-text">([^<]+)</span>', html)[1:]
    return {cap: re.findall(r'<li class="toctree-l1"><a class="reference internal" href="([^"#]+)"', body)
            for cap,body in zip(parts[::2], parts[1::2])}

def test_sidebar_for_users(visited):
    "The sidebar as users read it (tutorial, how-to guides, reference, explanation), the internals last; every page in it"
    page = visited['index.html']
    side = _sidebar(page['html'])
    assert list(side) == ['Tutorial', 'How-to guides', 'Reference', 'Explanation', 'Internals']
    assert side['Reference'] == [f'reference/{n}.html' for n in REFERENCE] # the public API, what works with what
    assert {'core.html', 'callback.html', 'checkpoint.html', 'microbatch.html'} <= set(side['Internals'])
    linked = {urlsplit(l).path.lstrip('/') for l in page['links']}
    assert {'tutorial.html', 'guides/migrating.html', 'reference/checkpoints.html', 'checkpoint.html'} <= linked
    own = {'index.html', 'search.html', 'genindex.html', 'py-modindex.html'} # Sphinx's, and the landing page
    assert sorted(n for n in visited if n not in own and n not in linked) == []

def test_pages_load_without_errors(visited):
    bad = {n: (v['status'], v['errors']) for n,v in visited.items() if v['status'] != 200 or v['errors']}
    assert not bad, bad

def test_offline(visited):
    "No page asks for anything outside the site (fonts, scripts, styles from a CDN), nor for a file it lacks"
    bad = {n: v['outside'] for n,v in visited.items() if v['outside']}
    assert not bad, bad
    assert not _Handler.missing, f"requested but not in the site: {sorted(set(_Handler.missing))}"

def test_internal_links_and_anchors(base, visited):
    "Every link within the site reaches a page and the element its `#fragment` names (`core.html#learner.fit`)"
    bad,root = [],urlsplit(base).path
    for name,v in visited.items():
        for url in v['links']:
            if not url.startswith(base): continue
            u = urlsplit(url)
            target = u.path[len(root):] or 'index.html'
            if target.endswith('/'): target += 'index.html'
            if not (SITE/target).exists(): bad.append(f'{name}: {url} (no page)')
            elif u.fragment and target in visited and u.fragment not in visited[target]['ids']:
                bad.append(f'{name}: {url} (no anchor)')
    assert not bad, '\n'.join(bad)

def test_signatures_have_no_addresses(visited):
    "A default shown as `<object object at 0x7f..>` (Accelerate's sentinels) is noise that changes every build"
    found = {n: _ADDRESS.findall(v['text'] + v['html']) for n,v in visited.items()}
    bad = {n: f for n,f in found.items() if f}
    assert not bad, bad

@pytest.mark.parametrize('page', ['reference/accelerate.html', 'callback.html']) # its reference, and where it is taught
def test_api_reference_rendered(visited, page):
    "show_doc's signature and docstring for the main entry point, under nbdev's anchor"
    page = visited[page]
    assert 'learner.accelerate' in page['ids']
    assert 'def accelerate(' in page['text'] and 'split_batches:bool=False' in page['text']

def _public_anchors():
    """nbdev's anchor (`_modidx.py`) of each name a user calls or passes: a name in its module's `__all__`, or a method
    or patch of a class (`Learner.accelerate`, `EMACallback.swapped`); no `_` name, no event a callback handles"""
    from fastxtend_accel._modidx import d
    @functools.cache
    def names(path): # the module's `__all__`, read without importing it (and torch)
        for n in ast.parse((Path(__file__).parents[1]/path).read_text()).body:
            if isinstance(n, ast.Assign) and [getattr(t, 'id', '') for t in n.targets] == ['__all__']:
                return set(ast.literal_eval(n.value))
        return set()
    res = set()
    for mod,syms in d['syms'].items():
        for sym,(url,path) in syms.items():
            parts = sym[len(mod)+1:].split('.')
            if any(p.startswith('_') for p in parts) or re.match(r'(before|after)_', parts[-1]): continue
            if len(parts) > 1 or parts[0] in names(path): res.add(url.split('#')[1])
    return res

def test_reference_documents_public_names(visited):
    "Each reference page documents public names only, at least one; `CheckpointCallback` has its entry on its page"
    public = _public_anchors()
    assert {'learner.accelerate', 'checkpointcallback', 'emacallback.swapped', 'reduction'} <= public
    assert not {'_averaged', 'checkpointcallback.before_fit', 'acceleratorcallback.after_batch'} & public
    entries = {n: _ENTRY.findall(v['html']) for n,v in visited.items() if n.startswith('reference/')}
    assert entries.pop('reference/compatibility.html') == [] # a table, no API
    assert sorted(entries) == sorted(f'reference/{n}.html' for n in API)
    assert {n: sorted(set(e) - public) for n,e in entries.items()} == {n: [] for n in entries}
    assert [n for n,e in entries.items() if not e] == []
    assert entries['reference/checkpoints.html'] == [
        'checkpointcallback', 'learner.save_state', 'learner.load_state', 'learner.finish_save', 'learner.verify_state',
        'latest_checkpoint', 'scan_checkpoints', 'verify_checkpoint', 'verify_checkpoint_cmd', 'checkpoint_to_weights',
        'stopsignals']
    assert 'checkpointcallback' in visited['reference/checkpoints.html']['ids']
    assert entries['reference/accelerate.html'][:2] == ['learner.accelerate', 'acceleratorcallback']

@pytest.mark.parametrize('word,page', [('accelerate', 'callback.html'), ('CheckpointCallback', 'checkpoint.html'),
                                       ('CheckpointCallback', 'reference/checkpoints.html')])
def test_search_finds(base, browser, word, page):
    "Type into the search box as a reader does; Sphinx's search, in the page, lists the page that teaches `word`"
    tab = browser.new_page()
    tab.goto(base + 'index.html')
    box = tab.locator('input[name="q"]').first
    box.fill(word)
    box.press('Enter')
    tab.wait_for_url(f'**/search.html?q={word}*')
    hits = tab.locator('#search-results li')
    hits.first.wait_for(timeout=20_000)
    assert hits.count() > 0 and tab.locator(f'#search-results a[href*="{page}"]').count() > 0
    tab.close()

def test_doc_link_lands_on_its_entry(base, browser):
    "A backticked name's link scrolls to its API entry (Furo scrolls smoothly: wait until it arrives)"
    page = browser.new_page()
    page.goto(base + 'callback.html#learner.accelerate')
    top = "document.getElementById('learner.accelerate').getBoundingClientRect().top"
    page.wait_for_function(f"() => Math.abs({top}) < 150", timeout=10_000)
    page.close()

def test_screenshots(base, browser, tmp_path):
    "The landing page and the core page render as pictures a person can look at (kept in `DOCS_SCREENSHOTS=folder`)"
    out = Path(os.environ.get('DOCS_SCREENSHOTS') or tmp_path)
    page = browser.new_page()
    for name in ('index.html', 'core.html', 'callback.html#learner.accelerate', 'reference/checkpoints.html',
                 'guides/evaluation.html'):
        page.goto(base + name)
        page.wait_for_timeout(1500) # Furo's smooth scroll to the anchor
        png = out/f"{name.replace('.html', '').replace('#', '-').replace('/', '-')}.png"
        page.screenshot(path=str(png))
        data = png.read_bytes()
        w,h = int.from_bytes(data[16:20], 'big'),int.from_bytes(data[20:24], 'big') # the PNG header's size
        assert data[:8] == b'\x89PNG\r\n\x1a\n' and (w,h) == (1440, 1000) and len(set(data[-4096:])) > 16, name # not blank
    imgs = page.eval_on_selector_all('img', 'es => es.map(e => [e.naturalWidth, e.complete])') # the last page's pictures
    page.close()
    assert len(imgs) >= 2 and all(w > 0 and done for w,done in imgs), imgs

def test_compatibility_table(visited):
    "What works with what: the matrix's table, a row and a column for each option's value, each pair marked"
    html = visited['reference/compatibility.html']['html']
    rows = re.findall(r'<tr[^>]*>(.*?)</tr>', html, re.S)
    cells = [re.findall(r'<t[dh][^>]*>(.*?)</t[dh]>', r, re.S) for r in rows]
    assert len(cells) == 22 and all(len(c) == 22 for c in cells) # 21 values of the options, and the headings
    marks = [re.sub(r'<[^>]+>', '', m).strip() for r in cells[1:] for m in r[1:]]
    assert all(re.fullmatch(r'[✓✗]\d?|—', m) for m in marks) and marks.count('✓') > 300 # no pair unknown ('?')
