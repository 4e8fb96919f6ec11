"""Result sets: ``results/<run-id>/`` written, read and summarised."""
