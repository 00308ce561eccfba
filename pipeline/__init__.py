"""PySpark jobs over the fifo machine: distributed fuzz campaigns (see DESIGN.md section 6).

`pipeline -> fifo` is the only dependency direction; nothing here is imported by `fifo`.
"""
