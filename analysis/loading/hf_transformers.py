"""placeholder"""
def is_hf_model(m): return False
