#!/usr/bin/python3
"""DeepSpeed's csvMonitor.write_events (deepspeed/monitor/csv_monitor.py), standard library
only, used by test_csv_monitor as the independent reference for the files' bytes.

usage: ds_csv_reference.py EVENTS OUTPUT_PATH JOB_NAME
EVENTS has one event per line: tag<TAB>value<TAB>step, the value as %.17g for a Python float
or as i:<n> for a Python int. A line "RESUME" starts a new
process (DeepSpeed forgets which files it has written); the one change from DeepSpeed is
that the header is written only into an empty file, so a resumed run has one header.
"""
import csv
import os
import sys


class CsvMonitor:
    def __init__(self, output_path, job_name):
        self.filenames = []
        self.log_dir = os.path.join(output_path, job_name)
        os.makedirs(self.log_dir, exist_ok=True)

    def write_events(self, event_list):
        for log_name, value, step in event_list:
            if '/' in log_name:
                header = log_name.split('/')[-1]
            else:
                header = log_name
            filename = log_name.replace('/', '_').replace(' ', '_')
            fname = self.log_dir + '/' + filename + '.csv'
            with open(fname, 'a+') as f:
                writer = csv.writer(f)
                if filename not in self.filenames:
                    self.filenames.append(filename)
                    if f.tell() == 0:
                        writer.writerow(['step', header])
                writer.writerow([step, value])


def main():
    events, output_path, job_name = sys.argv[1:4]
    mon = CsvMonitor(output_path, job_name)
    with open(events) as f:
        for line in f:
            line = line.rstrip('\n')
            if line == 'RESUME':
                mon = CsvMonitor(output_path, job_name)
                continue
            tag, value, step = line.split('\t')
            value = int(value[2:]) if value.startswith('i:') else float(value)
            mon.write_events([(tag, value, int(step))])


main()
