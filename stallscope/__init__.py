"""stallscope: find where GPU jobs lose time.

The headless core (ingest -> store -> analyzers -> report) lives in this
package and never imports streamlit; ``stallscope.pages`` is the dashboard.
"""

__version__ = "0.1.0"
