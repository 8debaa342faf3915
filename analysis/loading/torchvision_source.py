"""placeholder"""
def is_torchvision_vit(m): return False
