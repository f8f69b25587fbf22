"""Dashboard entry point for ``streamlit run app.py`` from a checkout.

The same app runs with ``stallscope serve``; all the logic is in
``stallscope.pages`` and the headless core.
"""

from stallscope.pages.main import main

main()
