"Sphinx renders the notebooks `python tools/docs.py stage` writes (`_build/docs/`): saved outputs, nothing executed"
from pathlib import Path

project = html_title = 'fastxtend_accel'
extensions = ['myst_nb']
nb_execution_mode = 'off'           # the notebooks' saved outputs, and show_doc's from nbdev's processor
myst_all_links_external = True      # nbdev's links are plain `page.html#sym` URLs; tests/test_docs.py checks each one
myst_enable_extensions = ['colon_fence']
suppress_warnings = ['myst.header'] # show_doc's `###` headings sit under `##` sections or right under the title
html_theme = 'furo'
html_static_path = [str(Path(__file__).parent/'static')]
html_css_files = ['nbdev.css']
html_show_sourcelink = html_copy_source = False
