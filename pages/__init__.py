"""The Streamlit dashboard: thin pages over the headless core."""
