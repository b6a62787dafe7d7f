"""`shardfeed train` and `shardfeed demo`: the reference DDP trainer and the end-to-end demo."""
