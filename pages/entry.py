"""Script that `stallscope serve` hands to Streamlit (same as app.py in a checkout)."""

from stallscope.pages.main import main

main()
