"""Streamlit explorer for Vision Transformer attention: ``streamlit run vizapp/app.py``."""
