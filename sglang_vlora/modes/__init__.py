"""Inference modes (paper §4.4): the swift switcher (merge / unmerge / fused switch
with bit-exact base weights, :mod:`.switcher`) and the mixture mode's work items
(deLoRA, :mod:`.delora`). Imports no SGLang."""
