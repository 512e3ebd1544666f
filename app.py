"""python app.py -> the decodescope Gradio app (the Space's entry point; `decodescope` once installed)."""
from ui.app import main

if __name__ == "__main__":
    main()
