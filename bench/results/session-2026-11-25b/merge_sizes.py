"""Merge the size classes of a `portanet tune --output` file into a tuned.json: each entry
of the tune file that the database has keeps the database's own classes and takes the
tune file's beside them (the tune file's params and size stay the database's)."""
import json, sys

tuned_path, new_path = sys.argv[1], sys.argv[2]
db, new = json.load(open(tuned_path)), json.load(open(new_path))
for key, e in new["entries"].items():
    if key in db["entries"]:
        db["entries"][key]["sizes"].update(e["sizes"])
        print(key, "now has classes", sorted(db["entries"][key]["sizes"], key=int))
    else:
        print(key, "is not in", tuned_path)
json.dump(db, open(tuned_path, "w"), indent=1)
