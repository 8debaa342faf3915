"""Rules for 2-D maps that every analysis and figure shares: scaling and upsampling."""
