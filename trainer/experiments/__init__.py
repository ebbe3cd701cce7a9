"""Controlled experiments (`gagar experiment bloat|skew`) that show GAPO's and GAGAR's mechanisms on CPU."""
