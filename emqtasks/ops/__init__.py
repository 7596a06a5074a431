"""Operating a queue: the consistency check and repair (check.py), `emqtasks doctor`
(doctor.py), least-privilege ACL users (acl.py), the embedded server (embedded.py), private
servers on a free port (localserver.py) and the server's kind (servers.py)."""
