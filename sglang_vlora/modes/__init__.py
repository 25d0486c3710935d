"""Inference modes (paper §4.4): the swift switcher (merge / unmerge / fused switch
with bit-exact base weights, :mod:`.switcher`), the mixture mode's work items
(deLoRA, :mod:`.delora`) and, in the server's scheduler, the mode controller over the
model's weights (:mod:`.controller`, driven by the hooks of :mod:`.mode_hooks`). Only
:mod:`.mode_hooks` imports SGLang."""
