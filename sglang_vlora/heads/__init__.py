"""Vision task heads: a small classifier on the LLM's last hidden state (paper §4.2.2).

:mod:`.task_head` is the head (torch only, shared with the trainer), :mod:`.head_requests`
what a request asks of a head and gets back, :mod:`.head_hooks` the hooks that answer head
requests inside SGLang, :mod:`.output_processors` the client's structured answers."""
