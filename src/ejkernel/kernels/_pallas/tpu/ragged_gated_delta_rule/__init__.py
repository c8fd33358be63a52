"""Upstream's TPU home of the ragged gated delta rule's decode step (`_interface._decode_path`); no TPU kernel yet."""
